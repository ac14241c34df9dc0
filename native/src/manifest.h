// manifest.json of a .aotpack archive (docs/archive.md) and the checks against the entries.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>
#include <string>
#include <vector>

#include "aotpack/types.h"
#include "limits.h"

namespace aotpack::detail {

inline constexpr int64_t kFormatVersion = 2;
inline constexpr char kManifestPath[] = "manifest.json";
inline constexpr char kManifestDigestPath[] = "manifest.sha256";  // 2nd entry
inline constexpr char kManifestSignaturePath[] = "manifest.sig";   // optional 3rd entry
inline constexpr char kWeightsPath[] = "weights/weights.safetensors";

struct FileRecord {
  std::string sha256;  // lower-case hex
  uint64_t size = 0;   // bytes
};

struct Manifest {
  int64_t format_version = 0;
  std::string name, version, aotpack_version, torch_version, backend;
  std::string march;                      // target_isa.march (informational)
  std::vector<std::string> isa_features;  // target_isa.features
  int64_t device_limit = 0;
  std::string model_library;  // model.library
  int64_t model_abi_version = 0;
  std::vector<TensorSpec> constants, inputs, outputs;
  std::vector<std::string> mutated_buffers;
  std::unordered_map<std::string, FileRecord> files;
  std::string text;  // manifest.json as stored
};

/// Parses manifest.json (UTF-8 without a byte-order mark, nesting depth <= `max_depth`).
/// Checks format_version first (so a newer format gets a clear message rather than a
/// missing-key error), then every key the runtime uses: `files` paths are safe relative
/// paths other than the manifest entries, digests are 64 lower-case hex digits, and
/// model.library is one of the files. Throws aotpack::Error naming the key
/// ("manifest.json: inputs[0].dtype: ...").
Manifest parse_manifest(const std::string& text, uint64_t max_depth = 64);

/// Throws unless the manifest's `files` fit `limits` (entry count, each size, total size).
void check_limits(const Manifest& manifest, const Limits& limits);

/// True for the entries that carry the manifest itself (never listed in `files`).
bool is_manifest_entry(const std::string& path);

}  // namespace aotpack::detail
