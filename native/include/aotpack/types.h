// aotpack/types.h: the light part of the C++ API (no ATen headers, only c10's ScalarType).
//
// Shared by the runtime's own sources and by runtime.h; C code uses runtime.h's C API instead.
#ifndef AOTPACK_TYPES_H
#define AOTPACK_TYPES_H

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "aotpack/model_abi.h"  // AOTPACK_EXPORT

namespace aotpack {

/// The only exception type the C++ API throws. what() is a complete message meant for a
/// person: it names the archive (for load errors) or the model and the input or output.
class AOTPACK_EXPORT Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One tensor of the manifest signature (an input, an output or a constant).
/// shape and strides are in elements and have the same length.
struct TensorSpec {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

/// torch's dtype name without the prefix ("float32", "int64", "bool", ...); "dtype<N>" for
/// a ScalarType the archive format does not name.
AOTPACK_EXPORT std::string dtype_name(c10::ScalarType dtype);

/// "float32[32, 512]": dtype and shape, the form every signature error message uses.
AOTPACK_EXPORT std::string describe(c10::ScalarType dtype, const std::vector<int64_t>& shape);

}  // namespace aotpack

#endif  // AOTPACK_TYPES_H
