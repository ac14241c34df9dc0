// The AotpackHostV1 table handed to model.so: libtorch behind a small C interface.
#pragma once

#include <string>

#include "aotpack/model_abi.h"

namespace aotpack::detail {

/// The runtime's host table (static storage, valid for the process lifetime).
const AotpackHostV1* host_table();

/// Message of the last failed host call on this thread.
const char* host_last_error();

/// Message of a caught exception: c10::Error without its C++ backtrace, else what().
std::string exception_message(const std::exception& e);

}  // namespace aotpack::detail
