// .npy encoding and atomic .npz writing for aotpack-run's outputs (and its tests). Inputs
// are read by the runtime's own reader (aotpack::load_npy, native/src/npy.h).
//
// Encodes the dtypes .npy holds: <f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1 (C order).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "aotpack/types.h"

namespace aotpack::npy {

/// The .npy file (format 1.0, or 2.0 for huge headers) for row-major `data`.
/// Throws aotpack::Error for a dtype .npy cannot hold (e.g. bfloat16) or a size mismatch.
std::string encode(c10::ScalarType dtype, const std::vector<int64_t>& shape, const void* data,
                   size_t nbytes);

/// Writes a .npz (uncompressed zip of "<name>.npy" members) to `path` atomically: a temp
/// file in the same folder, fsync, then rename. Throws aotpack::Error; on error `path` is
/// left as it was.
void write_npz(const std::string& path,
               const std::vector<std::pair<std::string, std::string>>& named_npy_files);

}  // namespace aotpack::npy
