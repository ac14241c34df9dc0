// A safetensors reader over an in-memory file (the archive entry), no copies.
#pragma once

#include <cstdint>
#include <map>
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

/// Parses `file` (8-byte little-endian header length, JSON header, data). Views point into
/// `file`, which must outlive them. Throws aotpack::Error on a malformed header, an unknown
/// dtype, or data offsets that are out of range or disagree with dtype and shape.
std::map<std::string, SafeTensorView> parse_safetensors(const std::string& file);

}  // namespace aotpack::detail
