// .npy reading/writing and atomic .npz writing for aotpack-run (and its tests).
//
// Supported dtypes: <f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1 (little-endian, C order). Fortran
// order and big-endian data are refused with a clear error.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "aotpack/types.h"

namespace aotpack::npy {

struct Array {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  std::string data;            // numel * itemsize bytes, in the order below
  bool fortran_order = false;  // column-major data (numpy's order='F', e.g. a saved a.T)
};

/// Parses the bytes of a .npy file; `label` names it in errors. Throws aotpack::Error.
Array parse(const std::string& bytes, const std::string& label);

/// Reads and parses the .npy file at `path`, which must be a regular file (read up to its
/// size, so a device or FIFO cannot make it read forever). Throws aotpack::Error naming it.
Array read(const std::string& path);

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
