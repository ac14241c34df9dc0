// dtype names of the archive format and of safetensors, mapped to c10::ScalarType.
#pragma once

#include <string>

#include "aotpack/types.h"

namespace aotpack::detail {

/// "float32" -> Float, ... for the ten dtypes of docs/archive.md; throws naming the
/// allowed names otherwise.
c10::ScalarType dtype_from_name(const std::string& name);

/// "F32" -> Float, ... for F32 F64 F16 BF16 I64 I32 I16 I8 U8 BOOL; throws otherwise.
c10::ScalarType dtype_from_safetensors(const std::string& code);

/// True for an AotpackDType / c10::ScalarType code the runtime can allocate.
bool is_supported_dtype_code(int32_t code);

}  // namespace aotpack::detail
