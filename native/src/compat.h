// Can this process run the archive? backend, torch version, the device's target, ABI versions.
#pragma once

#include <cstdint>
#include <string>

#include "manifest.h"

namespace aotpack::detail {

class Device;

/// Throws aotpack::Error unless the manifest's backend names a device of this runtime
/// (device.h), its torch major.minor matches, that device accepts its target
/// (Device::check_target) and its model ABI version matches; checked in that order.
/// Returns the backend's device.
const Device& check_compatibility(const Manifest& manifest);

/// "MAJOR.MINOR" of a packed ABI version ((MAJOR << 16) | MINOR), e.g. 0x20000 -> "2.0".
std::string abi_version_text(int64_t packed);

/// Throws aotpack::Error naming both versions unless `library` (a model.so reporting
/// `packed` from aotpack_model_abi_version()) has this runtime's model ABI MAJOR.
void check_model_abi(const std::string& library, int64_t packed);

}  // namespace aotpack::detail
