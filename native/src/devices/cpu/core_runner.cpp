#include "core_runner.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstring>

#include "../../util.h"

namespace aotpack::detail {

namespace {

// A function of a library the process has already loaded (by soname), or NULL: the
// runtime must call the libgomp and MKL that libtorch uses, never load its own.
template <class Fn>
Fn loaded_symbol(const char* library, const char* name) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  auto fn = reinterpret_cast<Fn>(dlsym(handle, name));
  dlclose(handle);  // drops the reference NOLOAD took; the library stays loaded
  return fn;
}

cpu_set_t cpu_set_of(const std::vector<int32_t>& cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int32_t c : cores) CPU_SET(c, &set);
  return set;
}

// Pins the calling thread and gives it `n` threads for OpenMP and MKL; "" or the problem.
std::string pin_this_thread(const std::vector<int32_t>& cores) {
  const cpu_set_t set = cpu_set_of(cores);
  if (int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0)
    return "cannot pin a thread to cores " + format_cores(cores) + ": " + std::strerror(rc);
  const std::string name = "aotpack/" + format_cores(cores);
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  const int n = static_cast<int>(cores.size());
  // libtorch initialises a thread's OpenMP count at its first parallel op, from the
  // process-wide default; do that now so the count set below is the one that stays.
  (void)at::get_num_threads();
  if (auto set_omp = loaded_symbol<void (*)(int)>("libgomp.so.1", "omp_set_num_threads")) set_omp(n);
  if (auto set_mkl = loaded_symbol<int (*)(int)>("libtorch_cpu.so", "MKL_Set_Num_Threads_Local"))
    set_mkl(n);
  return "";
}

}  // namespace

std::vector<int32_t> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int32_t> cores;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cores;
  for (int32_t c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  return cores;
}

std::string format_cores(const std::vector<int32_t>& sorted_cores) {
  std::string out;
  for (size_t i = 0; i < sorted_cores.size();) {
    size_t j = i;
    while (j + 1 < sorted_cores.size() && sorted_cores[j + 1] == sorted_cores[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(sorted_cores[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(sorted_cores[j]);
    }
    i = j + 1;
  }
  return out;
}

std::vector<int32_t> check_cores(const std::vector<int32_t>& cores) {
  if (cores.empty()) fail("the core set is empty");
  std::vector<int32_t> sorted = cores;
  std::sort(sorted.begin(), sorted.end());
  const std::vector<int32_t> allowed = allowed_cores();
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int32_t c = sorted[i];
    if (c < 0) fail("core " + std::to_string(c) + " is negative");
    if (i > 0 && sorted[i - 1] == c) fail("core " + std::to_string(c) + " is listed twice");
    if (!std::binary_search(allowed.begin(), allowed.end(), c))
      fail("core " + std::to_string(c) + " is not available to this process (it may use " +
           format_cores(allowed) + ")");
  }
  return sorted;
}

CoreRunner::CoreRunner(const std::vector<int32_t>& cores) : cores_(check_cores(cores)) {
  std::string pin_error;
  bool started = false;
  thread_ = std::thread([this, &pin_error, &started] {
    std::string problem = pin_this_thread(cores_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pin_error = problem;
      started = true;
    }
    wake_.notify_all();
    if (problem.empty()) loop();
  });
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [&] { return started; });
  if (!pin_error.empty()) {
    lock.unlock();
    thread_.join();
    fail(pin_error);
  }
}

CoreRunner::~CoreRunner() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CoreRunner::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || (job_ != nullptr && !done_); });
    if (job_ == nullptr || done_) return;  // stop_ with nothing left to run
    const std::function<void()>* job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*job)();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    done_ = true;
    wake_.notify_all();
  }
}

void CoreRunner::call(const std::function<void()>& fn) {
  std::lock_guard<std::mutex> one_at_a_time(call_mutex_);
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = &fn;
  done_ = false;
  error_ = nullptr;
  wake_.notify_all();
  wake_.wait(lock, [this] { return done_; });
  job_ = nullptr;
  if (std::exception_ptr error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
}

}  // namespace aotpack::detail
