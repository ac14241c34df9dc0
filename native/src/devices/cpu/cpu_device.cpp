#include "cpu_device.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty_strided.h>

#include "core_runner.h"
#include "cores.h"
#include "cpu_features.h"
#include "elf_check.h"
#include "host_pool.h"

namespace aotpack::detail {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class CpuDevice final : public Device {
 public:
  void check_target(const Manifest& manifest) const override { check_cpu_target(manifest); }

  bool is_binary(const std::string& path) const override { return ends_with(path, ".so"); }
  void check_binary(const std::string& path, const std::string& label) const override {
    check_elf(path, label);
  }

  int32_t compute_units() const override { return available_cores(); }
  void check_device_limit(int32_t device_limit) const override {
    detail::check_device_limit(device_limit);
  }
  std::unique_ptr<Partition> partition(const std::vector<int32_t>& units) const override {
    return std::make_unique<CoreRunner>(units);
  }

  void prepare_buffers() const override { host_pool(); }
  at::Tensor empty_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                           c10::ScalarType dtype) const override {
    HostPool& pool = host_pool();
    // Through the caching pool (host_pool.h) unless AOTPACK_HOST_CACHE_MB=0 turned it off;
    // then exactly what at::empty_strided does: ATen's CPU allocator.
    if (pool.cap_bytes() == 0) return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype));
    return at::Tensor(at::detail::empty_strided_generic(
        sizes, strides, &pool, c10::DispatchKeySet(c10::DispatchKey::CPU), dtype));
  }

  // A run returns when its kernels and ATen calls have finished.
  void synchronize() const override {}
};

}  // namespace

const Device& cpu_device() {
  static const CpuDevice device;
  return device;
}

}  // namespace aotpack::detail
