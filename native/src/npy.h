// The runtime's .npy reader: aotpack_npy_load / aotpack::load_npy, and through them
// aotpack-run and `aotpack run`, which therefore accept and refuse the same files with the
// same messages.
//
// Supported dtypes: <f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1 (little-endian; C or Fortran order).
// Big-endian, structured, string and object arrays are refused with a one-line error.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace aotpack::npy {

/// A .npy header, checked: dtype, shape and where the data lies in the file.
struct Header {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;  // () for a 0-dim array
  bool fortran_order = false;  // column-major data (numpy's order='F', e.g. a saved a.T)
  uint64_t data_offset = 0;    // where the data starts
  uint64_t data_bytes = 0;     // numel * itemsize
};

/// Largest header read (numpy writes ~128 bytes; a header is held in memory while parsed).
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
/// Most dimensions of an array (numpy 2's NPY_MAXDIMS).
constexpr size_t kMaxDims = 64;

/// Parses the header at the start of `prefix`, the first bytes of a file of `file_size`
/// bytes: magic, version, the dict, and the data size against the file size (the data must
/// fill the rest of the file exactly: no byte missing, none extra). `prefix` must hold at
/// least the whole header, else it throws "truncated". `label` names the file in errors.
/// Throws aotpack::Error.
Header parse_header(const std::string& prefix, uint64_t file_size, const std::string& label);

/// Reads the .npy file at `path`, a regular file: the header first, then the data straight
/// into the tensor, allocated only once its size matched the file's. Returns a row-major
/// CPU tensor of the file's dtype and shape (0-dim stays 0-dim; Fortran-order data is
/// transposed into row-major). Throws aotpack::Error naming the path and the problem.
at::Tensor read(const std::string& path);

/// The array of .npy file bytes held in memory (the tests' entry point); as read().
at::Tensor parse(const std::string& bytes, const std::string& label);

}  // namespace aotpack::npy
