// manifest.json of a .aotpack archive (docs/archive.md) and the checks against the entries.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "aotpack/types.h"
#include "archive.h"

namespace aotpack::detail {

inline constexpr int64_t kFormatVersion = 1;
inline constexpr char kManifestPath[] = "manifest.json";
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
  std::map<std::string, FileRecord> files;
  std::string text;  // manifest.json as stored
};

/// Parses manifest.json. Checks format_version first (so a newer format gets a clear
/// message rather than a missing-key error), then every key the runtime uses. Throws
/// aotpack::Error naming the key ("manifest.json: inputs[0].dtype: ...").
Manifest parse_manifest(const std::string& text);

/// Checks that the entries are exactly the manifest's `files`: each present with the
/// recorded size and sha256, none missing, none unlisted. Throws aotpack::Error.
void verify_files(const Manifest& manifest, const std::vector<ArchiveEntry>& entries);

/// The entry at `path`; throws aotpack::Error if there is none.
const ArchiveEntry& find_entry(const std::vector<ArchiveEntry>& entries, const std::string& path);

}  // namespace aotpack::detail
