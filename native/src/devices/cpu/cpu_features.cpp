#include "cpu_features.h"

#include <cctype>

#include "../../util.h"

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

void check_cpu_target(const Manifest& manifest) {
  const std::vector<std::string> missing = missing_cpu_features(manifest.isa_features);
  if (missing.empty()) return;
  std::string list;
  for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
  fail("this CPU lacks " + list + " required by target_isa" +
       (manifest.march.empty() ? "" : " (march=" + manifest.march + ")"));
}


}  // namespace aotpack::detail
