#include "cores.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "../../util.h"

namespace aotpack::detail {

int32_t available_cores() {
  int32_t cores = 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  std::ifstream quota_file("/sys/fs/cgroup/cpu.max");
  std::string quota;
  long long period = 0;
  if (quota_file >> quota >> period && quota != "max" && period > 0) {
    try {
      const long long q = std::stoll(quota);
      cores = std::min<int32_t>(cores, static_cast<int32_t>(std::max(1LL, q / period)));
    } catch (const std::exception&) {
    }
  }
  return std::max(1, cores);
}

void check_device_limit(int32_t device_limit) {
  if (device_limit < 0) fail("device_limit must be >= 0, got " + std::to_string(device_limit));
  const int32_t cores = available_cores();
  if (device_limit > cores)
    fail("device limit " + std::to_string(device_limit) + " exceeds the " +
         std::to_string(cores) +
         " cores available to this process (CPU affinity and cgroup quota); use at most " +
         std::to_string(cores));
}

}  // namespace aotpack::detail
