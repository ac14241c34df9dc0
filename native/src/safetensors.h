// A safetensors reader over bytes in memory (a memory-mapped file), no copies.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "aotpack/types.h"

namespace aotpack::detail {

struct SafeTensorView {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  const char* data = nullptr;  // row-major bytes inside the parsed buffer; may be unaligned
  uint64_t nbytes = 0;
};

/// A file mapped copy-on-write (MAP_PRIVATE, readable and writable): writes stay in this
/// process. Unmapped when the last shared_ptr goes.
struct MappedFile {
  const char* data = nullptr;
  size_t size = 0;
  /// Maps `path`; throws aotpack::Error naming it. An empty file maps to size 0.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
};

/// Parses `size` bytes at `file`. Views point into it, which must outlive them.
std::map<std::string, SafeTensorView> parse_safetensors(const char* file, size_t size);

/// Parses `file` (8-byte little-endian header length, JSON header, data). Views point into
/// `file`, which must outlive them. Throws aotpack::Error on a malformed header (parsed by
/// parse_strict_json), an unknown dtype, data offsets that are out of range or disagree
/// with dtype and shape, and tensors that overlap or leave bytes of the data to no tensor
/// (sorted by offset, they must cover the data back to back: docs/archive.md rule 6).
std::map<std::string, SafeTensorView> parse_safetensors(const std::string& file);

}  // namespace aotpack::detail
