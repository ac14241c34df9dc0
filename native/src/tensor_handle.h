// AotpackTensor <-> at::Tensor. A handle is an at::Tensor* (see model_abi.h): handles the
// runtime creates are heap-allocated (new reference), borrowed ones point at a live tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include "aotpack/model_abi.h"
#include "util.h"

namespace aotpack::detail {

/// The tensor behind a handle; throws aotpack::Error for NULL.
inline at::Tensor& unwrap(AotpackTensor handle) {
  if (handle == nullptr) fail("NULL tensor handle");
  return *reinterpret_cast<at::Tensor*>(handle);
}

/// A new reference the receiver must release.
inline AotpackTensor new_handle(at::Tensor tensor) {
  return reinterpret_cast<AotpackTensor>(new at::Tensor(std::move(tensor)));
}

/// A borrowed handle to `tensor`; valid while `tensor` lives, never released.
inline AotpackTensor borrow_handle(const at::Tensor& tensor) {
  return reinterpret_cast<AotpackTensor>(const_cast<at::Tensor*>(&tensor));
}

/// Takes ownership of a new reference (from new_handle) and frees the handle.
inline at::Tensor take_handle(AotpackTensor handle) {
  at::Tensor* owned = reinterpret_cast<at::Tensor*>(handle);
  at::Tensor tensor = std::move(*owned);
  delete owned;
  return tensor;
}

inline void release_handle(AotpackTensor handle) { delete reinterpret_cast<at::Tensor*>(handle); }

}  // namespace aotpack::detail
