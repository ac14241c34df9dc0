// A model's own thread, pinned to a core partition: every run of a model loaded with a
// core set executes here, so its fused kernels' OpenMP teams and ATen's intra-op threads
// (libgomp keeps one thread pool per thread that opens a parallel region, and the pool's
// threads inherit that thread's CPU affinity) stay on those cores and no other model's
// runs share or steal them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../device.h"

namespace aotpack::detail {

/// Checks a core set against the cores this thread may run on (sched_getaffinity) and
/// returns it sorted. Throws aotpack::Error naming the problem: an empty set, a negative
/// or duplicate core, or a core outside the affinity mask (the message lists the allowed
/// cores, e.g. "core 5 is not available to this process (it may use 0-1)").
std::vector<int32_t> check_cores(const std::vector<int32_t>& cores);

/// "0-3,6": a sorted core set in the kernel's cpulist format (/proc/*/status Cpus_allowed_list).
std::string format_cores(const std::vector<int32_t>& sorted_cores);

/// The cores this thread may run on, sorted.
std::vector<int32_t> allowed_cores();

/// One thread pinned to `cores` (pthread_setaffinity_np) with its thread counts set to
/// their number: libgomp's nthreads ICV of the thread (omp_set_num_threads: ATen's
/// `#pragma omp parallel` and oneDNN) and MKL's thread-local count. libtorch's lazy
/// per-thread initialisation runs first, so it cannot later overwrite them with the
/// process-wide default. Named "aotpack/<cores>" (visible in /proc/<pid>/task/*/comm).
class CoreRunner final : public Partition {
 public:
  /// Starts the thread; throws aotpack::Error when the cores are refused (check_cores)
  /// or the thread cannot be pinned.
  explicit CoreRunner(const std::vector<int32_t>& cores);
  /// Joins the thread (a call in progress finishes first).
  ~CoreRunner() override;
  CoreRunner(const CoreRunner&) = delete;
  CoreRunner& operator=(const CoreRunner&) = delete;

  /// Runs `fn` on the pinned thread and waits for it; an exception `fn` throws is
  /// rethrown here. Calls from several threads are served one at a time.
  void call(const std::function<void()>& fn) override;

  const std::vector<int32_t>& units() const override { return cores_; }

 private:
  void loop();

  std::vector<int32_t> cores_;
  std::mutex call_mutex_;  // one call at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void()>* job_ = nullptr;  // guarded by mutex_
  bool done_ = false;                           // guarded by mutex_
  bool stop_ = false;                           // guarded by mutex_
  std::exception_ptr error_;                    // guarded by mutex_
  std::thread thread_;
};

}  // namespace aotpack::detail
