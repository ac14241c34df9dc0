// A caching CPU allocator for the buffers model.so asks the host for (host_empty_strided):
// freed blocks are kept per size class and handed out again, so a model run with the shapes
// of the previous one allocates no fresh memory and faults in no fresh pages.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "aotpack/env_vars.h"

namespace aotpack::detail {

/// A thread-safe caching allocator of 64-byte aligned CPU blocks (the alignment ATen's CPU
/// allocator gives, which vectorised kernels rely on).
///
/// A request of n bytes is rounded up to its size class (block_size: 64 B steps up to 1 MiB,
/// 4 KiB pages above). allocate() reuses the smallest idle block of at least that size and at
/// most twice it, else allocates a new one. The DataPtr's deleter returns the block to its
/// pool; it stays idle there unless that would take the idle bytes above cap_bytes, in which
/// case it is freed. cap_bytes = 0 caches nothing (every block is freed when released).
///
/// Every block a pool handed out must be released before the pool is destroyed; the
/// runtime's pool (host_pool()) is never destroyed, because tensors given to the user may
/// outlive the model and the runtime's statics.
class HostPool final : public c10::Allocator {
 public:
  static constexpr size_t kAlignment = 64;

  /// Counters since construction (under the pool's mutex).
  struct Stats {
    uint64_t hits = 0;     // allocations served from idle blocks
    uint64_t misses = 0;   // allocations that asked the system for a new block
    uint64_t evicted = 0;  // released blocks freed because the cache was full (or off)
  };

  /// `cap_bytes`: the most idle bytes (sum of block sizes) kept for reuse.
  explicit HostPool(size_t cap_bytes);
  ~HostPool() override;  // frees the idle blocks
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  /// A block of at least `nbytes` bytes (64-byte aligned; empty DataPtr for 0 bytes).
  /// Throws c10::OutOfMemoryError when the system has no memory even after the idle blocks
  /// were freed.
  c10::DataPtr allocate(size_t nbytes) override;
  void copy_data(void* dest, const void* src, size_t count) const override;

  size_t cap_bytes() const { return cap_bytes_; }
  /// Bytes now held idle (sum of the idle blocks' sizes).
  size_t idle_bytes() const;
  Stats stats() const;
  /// Frees every idle block.
  void trim();

  /// Holds the pool's mutex across fork() (pthread_atfork handlers of host_pool()), so a
  /// child never inherits it locked by a thread that does not exist there.
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }

  /// The size class of an `nbytes` request: rounded up to 64 B below 1 MiB, to 4 KiB above.
  static size_t block_size(size_t nbytes);

 private:
  struct Header;
  static void release(void* data);  // the DataPtr deleter
  void give_back(Header* header);

  const size_t cap_bytes_;
  mutable std::mutex mutex_;
  std::multimap<size_t, Header*> idle_;  // block size -> idle block; guarded by mutex_
  size_t idle_bytes_ = 0;                // guarded by mutex_
  Stats stats_;                          // guarded by mutex_
};

/// The default cap on idle bytes of the runtime's pool (AOTPACK_HOST_CACHE_MB's default).
constexpr size_t kDefaultHostCacheBytes = size_t{AOTPACK_ENV_HOST_CACHE_MB_DEFAULT} << 20;

/// The cap an AOTPACK_HOST_CACHE_MB value sets, in bytes: a whole number of MiB, 0 = no
/// caching; NULL or "" = kDefaultHostCacheBytes. Throws (fail) a one-line message naming
/// the variable for anything else (signs, spaces, units, overflow).
size_t host_cache_cap_from(const char* raw);

/// The runtime's pool: created on the first call with the cap of AOTPACK_HOST_CACHE_MB
/// (read once), never destroyed. A bad value throws and leaves the pool unmade, so the
/// next call reads the variable again; Model::load calls this first, so the error is a
/// load error.
HostPool& host_pool();

}  // namespace aotpack::detail
