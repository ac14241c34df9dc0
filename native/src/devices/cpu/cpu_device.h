// The CPU device (device.h): target_isa features, ELF binaries, cores from affinity and
// cgroup quota, pinned core partitions with their OpenMP/MKL thread counts, and the
// caching host allocator.
#pragma once

#include "../../device.h"

namespace aotpack::detail {

/// The process-wide CPU device (never destroyed).
const Device& cpu_device();

}  // namespace aotpack::detail
