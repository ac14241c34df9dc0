// Small helpers shared by the runtime's sources.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "aotpack/types.h"

namespace aotpack::detail {

/// Throws aotpack::Error(message); marked noreturn so callers need no dummy returns.
[[noreturn]] void fail(const std::string& message);

/// "[32, 512]"
std::string format_ints(const std::vector<int64_t>& values);

/// numel * itemsize in bytes; throws when it overflows or a size is negative.
uint64_t checked_nbytes(const std::vector<int64_t>& shape, uint64_t itemsize);

}  // namespace aotpack::detail
