// Typed (unboxed) dispatcher calls of the GEMM/convolution ops aotpack tunes (host ABI 1.1).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "aotpack/model_abi.h"

namespace aotpack::detail {

/// A typed handle of operator `name`.`overload` (resolved and signature-checked once);
/// throws aotpack::Error naming the operator when it is not one of the typed ops.
void* find_typed_op(const std::string& name, const std::string& overload);

/// Calls a handle from find_typed_op; `args` hold every schema argument in order (the
/// call_op encoding). Throws on a wrong argument count or kind, or the op's own error.
at::Tensor call_typed_op(void* op, const AotpackArg* args, int64_t num_args);

}  // namespace aotpack::detail
