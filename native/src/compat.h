// Can this process run the archive? torch version, backend, CPU features, ABI versions.
#pragma once

#include <string>
#include <vector>

#include "manifest.h"

namespace aotpack::detail {

/// Throws aotpack::Error unless the manifest's backend, torch major.minor, target_isa
/// features and model ABI version all match this runtime and this CPU.
void check_compatibility(const Manifest& manifest);

/// The features of `features` this CPU lacks, each as a message fragment ("avx512f", or
/// "'foo' (unknown feature name)"). Names are matched case-insensitively, ignoring '.',
/// '_' and '-', so "sse4.2", "sse4_2" and "avx512_vnni" (the /proc/cpuinfo spelling) work.
std::vector<std::string> missing_cpu_features(const std::vector<std::string>& features);

/// "MAJOR.MINOR" of a packed ABI version ((MAJOR << 16) | MINOR), e.g. 0x20000 -> "2.0".
std::string abi_version_text(int64_t packed);

/// Throws aotpack::Error naming both versions unless `library` (a model.so reporting
/// `packed` from aotpack_model_abi_version()) has this runtime's model ABI MAJOR.
void check_model_abi(const std::string& library, int64_t packed);

}  // namespace aotpack::detail
