// The AotpackHostV1 table handed to model.so: libtorch behind a small C interface.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "aotpack/model_abi.h"

namespace aotpack::detail {

/// The runtime's host table (static storage, valid for the process lifetime).
const AotpackHostV1* host_table();

/// Message of the last failed host call on this thread.
const char* host_last_error();

/// Message of a caught exception: c10::Error without its C++ backtrace, else what().
std::string exception_message(const std::exception& e);

/// Runs `body` for a C entry point: 0 on success; any exception becomes status 1 with
/// its message in `error` (a thread-local slot of the caller's API), so none escapes.
template <class Body>
int32_t guarded(std::string& error, Body&& body) noexcept {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    error = exception_message(e);
  } catch (...) {
    error = "unknown C++ exception";
  }
  return 1;
}

}  // namespace aotpack::detail
