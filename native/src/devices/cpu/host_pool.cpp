#include "host_pool.h"

#include <c10/util/Exception.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "../../util.h"

namespace aotpack::detail {

// In front of every block, one alignment unit long, so the data after it stays 64-byte
// aligned and the deleter (which only gets the data pointer) finds the block's pool and size.
struct alignas(HostPool::kAlignment) HostPool::Header {
  HostPool* owner;
  size_t size;  // the block's size class (bytes usable after the header)
};

namespace {

constexpr size_t kSmallStep = 64;
constexpr size_t kLargeStep = 4096;
constexpr size_t kLargeFrom = size_t{1} << 20;

size_t round_up(size_t n, size_t step) { return (n + step - 1) / step * step; }

void* data_of(void* header) { return static_cast<char*>(header) + HostPool::kAlignment; }

}  // namespace

HostPool::HostPool(size_t cap_bytes) : cap_bytes_(cap_bytes) {
  static_assert(sizeof(Header) == kAlignment);
}

HostPool::~HostPool() { trim(); }

size_t HostPool::block_size(size_t nbytes) {
  constexpr size_t kMax = std::numeric_limits<size_t>::max() - kLargeStep - kAlignment;
  if (nbytes > kMax) return 0;  // no such block; allocate() reports it
  return nbytes < kLargeFrom ? round_up(nbytes, kSmallStep) : round_up(nbytes, kLargeStep);
}

c10::DataPtr HostPool::allocate(size_t nbytes) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (nbytes == 0) return c10::DataPtr(nullptr, cpu);
  const size_t size = block_size(nbytes);
  TORCH_CHECK_WITH(OutOfMemoryError, size != 0, "host pool: cannot allocate ", nbytes, " bytes");
  Header* header = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = idle_.lower_bound(size);
    if (it != idle_.end() && it->first / 2 <= size) {  // not more than twice the request
      header = it->second;
      idle_bytes_ -= it->first;
      idle_.erase(it);
      ++stats_.hits;
    } else {
      ++stats_.misses;
    }
  }
  if (header == nullptr) {
    void* raw = nullptr;
    if (posix_memalign(&raw, kAlignment, kAlignment + size) != 0) {
      trim();  // the idle blocks may be what is missing
      if (posix_memalign(&raw, kAlignment, kAlignment + size) != 0) raw = nullptr;
    }
    TORCH_CHECK_WITH(OutOfMemoryError, raw != nullptr, "host pool: out of memory allocating ",
                     nbytes, " bytes");
    header = new (raw) Header{this, size};
  }
  void* data = data_of(header);
  return c10::DataPtr(data, data, &HostPool::release, cpu);
}

void HostPool::release(void* data) {
  if (data == nullptr) return;
  auto* header = reinterpret_cast<Header*>(static_cast<char*>(data) - kAlignment);
  header->owner->give_back(header);
}

void HostPool::give_back(Header* header) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (header->size <= cap_bytes_ - std::min(cap_bytes_, idle_bytes_)) {
      try {
        // In front of the blocks of its size: the most recently used block is reused first.
        idle_.emplace_hint(idle_.lower_bound(header->size), header->size, header);
        idle_bytes_ += header->size;
        return;
      } catch (const std::bad_alloc&) {  // no memory for the map node: free the block instead
      }
    }
    ++stats_.evicted;
  }
  std::free(header);
}

void HostPool::trim() {
  std::multimap<size_t, Header*> blocks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks.swap(idle_);
    idle_bytes_ = 0;
  }
  for (auto& [size, header] : blocks) std::free(header);
}

size_t HostPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_bytes_;
}

HostPool::Stats HostPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void HostPool::copy_data(void* dest, const void* src, size_t count) const {
  default_copy_data(dest, src, count);
}

size_t host_cache_cap_from(const char* raw) {
  if (raw == nullptr || *raw == '\0') return kDefaultHostCacheBytes;
  const std::string bad = std::string(AOTPACK_ENV_HOST_CACHE_MB " must be a whole number of MiB ") +
                          "(0 turns the host buffer cache off), got '" + raw + "'";
  for (const char* c = raw; *c; ++c)
    if (*c < '0' || *c > '9') fail(bad);
  errno = 0;
  const unsigned long long mib = std::strtoull(raw, nullptr, 10);
  if (errno != 0 || mib > (std::numeric_limits<size_t>::max() >> 20)) fail(bad);
  return static_cast<size_t>(mib) << 20;
}

namespace {

HostPool* make_host_pool() {
  // Leaked: DataPtrs of tensors handed to the user may be freed during static destruction.
  static HostPool* pool = nullptr;
  pool = new HostPool(host_cache_cap_from(std::getenv(AOTPACK_ENV_HOST_CACHE_MB)));
  pthread_atfork([] { pool->lock_for_fork(); }, [] { pool->unlock_after_fork(); },
                 [] { pool->unlock_after_fork(); });
  return pool;
}

}  // namespace

HostPool& host_pool() {
  static HostPool* pool = make_host_pool();
  return *pool;
}

}  // namespace aotpack::detail
