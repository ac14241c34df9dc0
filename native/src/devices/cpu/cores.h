// Cores this process may use: its CPU affinity mask bounded by the cgroup v2 CPU quota
// (the same rule as aotpack/config.py available_cores).
#pragma once

#include <cstdint>

namespace aotpack::detail {

/// At least 1.
int32_t available_cores();

/// Throws aotpack::Error unless 0 <= device_limit <= available_cores(), naming the limit.
void check_device_limit(int32_t device_limit);

}  // namespace aotpack::detail
