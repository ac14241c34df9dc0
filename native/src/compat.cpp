#include "compat.h"

#include <torch/headeronly/version.h>

#include <cstdio>

#include "aotpack/model_abi.h"
#include "device.h"
#include "util.h"

namespace aotpack::detail {
namespace {

// "2.13.0+cpu" -> {2, 13}; {-1, -1} when it does not start with two numbers.
std::pair<int, int> major_minor(const std::string& version) {
  int major = -1, minor = -1;
  if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2) return {-1, -1};
  return {major, minor};
}

void check_torch_version(const std::string& built_with) {
  const auto [major, minor] = major_minor(built_with);
  if (major < 0) fail("torch_version '" + built_with + "' is not of the form X.Y[.Z]");
  if (major != TORCH_VERSION_MAJOR || minor != TORCH_VERSION_MINOR)
    fail("built with torch " + built_with + " but this runtime links torch " +
         std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
         " (major.minor must match)");
}

}  // namespace

std::string abi_version_text(int64_t packed) {
  return std::to_string(packed >> 16) + "." + std::to_string(packed & 0xffff);
}

void check_model_abi(const std::string& library, int64_t packed) {
  if ((packed >> 16) != AOTPACK_MODEL_ABI_VERSION_MAJOR)
    fail(library + " implements model ABI " + abi_version_text(packed) + ", this runtime implements " +
         abi_version_text(AOTPACK_MODEL_ABI_VERSION) + " (the major must match); rebuild the archive with "
         "this aotpack");
}

const Device& check_compatibility(const Manifest& manifest) {
  const Device& device = device_for_backend(manifest.backend);
  check_torch_version(manifest.torch_version);
  device.check_target(manifest);
  if (manifest.model_abi_version != AOTPACK_MODEL_ABI_VERSION_MAJOR)
    fail("model.abi_version " + std::to_string(manifest.model_abi_version) +
         " is not supported (this runtime implements model ABI " +
         abi_version_text(AOTPACK_MODEL_ABI_VERSION) + "; the major must match)");
  if (!manifest.files.count(manifest.model_library))
    fail("model.library '" + manifest.model_library +
         "' is not in " AOTPACK_MANIFEST_PATH " 'files'");
  if (!manifest.files.count(kWeightsPath) && !manifest.constants.empty())
    fail("the manifest lists constants but the archive has no " + std::string(kWeightsPath));
  return device;
}

}  // namespace aotpack::detail
