#include "compat.h"

#include <torch/headeronly/version.h>

#include <cctype>
#include <cstdio>

#include "aotpack/model_abi.h"
#include "util.h"

namespace aotpack::detail {
namespace {

// __builtin_cpu_supports needs a literal, hence one lambda per name. Keys are canonical
// (lower case, without '.', '_' and '-').
#if defined(__x86_64__) || defined(__i386__)
#define AOTPACK_CPU(key, gcc_name) {key, [] { return __builtin_cpu_supports(gcc_name) != 0; }}
struct CpuFeature {
  const char* key;
  bool (*supported)();
};
const CpuFeature kCpuFeatures[] = {
    AOTPACK_CPU("sse", "sse"),
    AOTPACK_CPU("sse2", "sse2"),
    AOTPACK_CPU("sse3", "sse3"),
    AOTPACK_CPU("ssse3", "ssse3"),
    AOTPACK_CPU("sse41", "sse4.1"),
    AOTPACK_CPU("sse42", "sse4.2"),
    AOTPACK_CPU("popcnt", "popcnt"),
    AOTPACK_CPU("avx", "avx"),
    AOTPACK_CPU("avx2", "avx2"),
    AOTPACK_CPU("fma", "fma"),
    AOTPACK_CPU("f16c", "f16c"),
    AOTPACK_CPU("bmi", "bmi"),
    AOTPACK_CPU("bmi1", "bmi"),
    AOTPACK_CPU("bmi2", "bmi2"),
    AOTPACK_CPU("avx512f", "avx512f"),
    AOTPACK_CPU("avx512bw", "avx512bw"),
    AOTPACK_CPU("avx512vl", "avx512vl"),
    AOTPACK_CPU("avx512dq", "avx512dq"),
    AOTPACK_CPU("avx512cd", "avx512cd"),
    AOTPACK_CPU("avx512vnni", "avx512vnni"),
    AOTPACK_CPU("avx512bf16", "avx512bf16"),
    AOTPACK_CPU("avx512fp16", "avx512fp16"),
    AOTPACK_CPU("avx512vbmi", "avx512vbmi"),
    AOTPACK_CPU("avx512vbmi2", "avx512vbmi2"),
    AOTPACK_CPU("avx512ifma", "avx512ifma"),
    AOTPACK_CPU("avx512bitalg", "avx512bitalg"),
    AOTPACK_CPU("avx512vpopcntdq", "avx512vpopcntdq"),
    AOTPACK_CPU("avxvnni", "avxvnni"),
    AOTPACK_CPU("popcnt", "popcnt"),
    AOTPACK_CPU("gfni", "gfni"),
    AOTPACK_CPU("vaes", "vaes"),
    AOTPACK_CPU("vpclmulqdq", "vpclmulqdq"),
    AOTPACK_CPU("amxtile", "amx-tile"),
    AOTPACK_CPU("amxint8", "amx-int8"),
    AOTPACK_CPU("amxbf16", "amx-bf16"),
};
#undef AOTPACK_CPU
#endif

std::string canonical_feature(const std::string& name) {
  std::string key;
  for (unsigned char c : name)
    if (c != '.' && c != '_' && c != '-') key += static_cast<char>(std::tolower(c));
  return key;
}

// -1 when the name is unknown to this runtime (or not an x86 build).
int cpu_has(const std::string& name) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const std::string key = canonical_feature(name);
  for (const CpuFeature& f : kCpuFeatures)
    if (key == f.key) return f.supported() ? 1 : 0;
#else
  (void)name;
#endif
  return -1;
}

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

void check_cpu(const Manifest& manifest) {
  const std::vector<std::string> missing = missing_cpu_features(manifest.isa_features);
  if (missing.empty()) return;
  std::string list;
  for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
  fail("this CPU lacks " + list + " required by target_isa" +
       (manifest.march.empty() ? "" : " (march=" + manifest.march + ")"));
}

}  // namespace

std::vector<std::string> missing_cpu_features(const std::vector<std::string>& features) {
  std::vector<std::string> missing;
  for (const std::string& name : features) {
    int has = cpu_has(name);
    if (has == 0) missing.push_back(name);
    if (has < 0) missing.push_back("'" + name + "' (unknown feature name, treated as unsupported)");
  }
  return missing;
}

std::string abi_version_text(int64_t packed) {
  return std::to_string(packed >> 16) + "." + std::to_string(packed & 0xffff);
}

void check_model_abi(const std::string& library, int64_t packed) {
  if ((packed >> 16) != AOTPACK_MODEL_ABI_VERSION_MAJOR)
    fail(library + " implements model ABI " + abi_version_text(packed) + ", this runtime implements " +
         abi_version_text(AOTPACK_MODEL_ABI_VERSION) + " (the major must match); rebuild the archive with "
         "this aotpack");
}

// The backends whose archives hold host shared objects (aotpack/archive/layout.py HOST_BACKENDS).
static void check_backend(const std::string& backend) {
  const char* const names[] = AOTPACK_HOST_BACKENDS;
  std::string list;
  for (const char* name : names) {
    if (backend == name) return;
    list += (list.empty() ? "'" : ", '") + std::string(name) + "'";
  }
  fail("backend '" + backend + "' is not supported (this runtime runs " + list + " archives)");
}

void check_compatibility(const Manifest& manifest) {
  check_backend(manifest.backend);
  check_torch_version(manifest.torch_version);
  check_cpu(manifest);
  if (manifest.model_abi_version != AOTPACK_MODEL_ABI_VERSION_MAJOR)
    fail("model.abi_version " + std::to_string(manifest.model_abi_version) +
         " is not supported (this runtime implements model ABI " +
         abi_version_text(AOTPACK_MODEL_ABI_VERSION) + "; the major must match)");
  if (!manifest.files.count(manifest.model_library))
    fail("model.library '" + manifest.model_library +
         "' is not in " AOTPACK_MANIFEST_PATH " 'files'");
  if (!manifest.files.count(kWeightsPath) && !manifest.constants.empty())
    fail("the manifest lists constants but the archive has no " + std::string(kWeightsPath));
}

}  // namespace aotpack::detail
