// Shared by the C API's source files (c_api.cpp, dlpack_api.cpp): the handle behind
// aotpack_model_t and the thread-local slot aotpack_last_error() reads.
#pragma once

#include <string>
#include <utility>

#include "aotpack/runtime.h"
#include "host.h"

struct aotpack_model {
  aotpack::Model model;
  std::string warnings;  // model.warnings(), one per line (aotpack_model_warnings)
};

namespace aotpack::detail {

/// The C handle of a loaded model, its warnings joined for aotpack_model_warnings.
inline aotpack_model* new_model_handle(aotpack::Model model) {
  auto* handle = new aotpack_model{std::move(model), {}};
  for (const std::string& w : handle->model.warnings())
    handle->warnings += (handle->warnings.empty() ? "" : "\n") + w;
  return handle;
}

}  // namespace aotpack::detail

namespace aotpack::detail {

/// This thread's message of the last failed C API call.
std::string& c_api_last_error();

/// Runs `body` for a C API entry point: any exception becomes status 1 and its message
/// goes to aotpack_last_error().
template <class Body>
int32_t c_api_guarded(Body&& body) noexcept {
  return guarded(c_api_last_error(), std::forward<Body>(body));
}

}  // namespace aotpack::detail
