// The runtime's seam to the hardware an archive runs on, as aotpack/backends/base.py's
// Backend/Device is the build's: the manifest's `backend` names a Device (a registry), and
// generic code (model.cpp, extraction, the host table) asks it for everything
// device-specific. The CPU device lives in src/devices/cpu/.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "manifest.h"

namespace aotpack::detail {

/// A set of compute units a model runs on alone (LoadOptions.cores): its create and every
/// run execute there, the caller waiting.
class Partition {
 public:
  virtual ~Partition() = default;
  /// Runs `fn` on the partition and waits for it; an exception `fn` throws is rethrown
  /// here. Calls from several threads are served one at a time.
  virtual void call(const std::function<void()>& fn) = 0;
  /// The partition's compute units, sorted.
  virtual const std::vector<int32_t>& units() const = 0;
};

/// What the runtime needs of a device. Every method throws aotpack::Error with a message
/// that names the problem; implementations are stateless singletons (device_for_backend).
class Device {
 public:
  virtual ~Device() = default;

  /// Throws unless this machine can run code built for the manifest's target (the CPU:
  /// its target_isa features).
  virtual void check_target(const Manifest& manifest) const = 0;

  /// Whether the archive file `path` (relative, e.g. "kernels/k0/wrapper.so") is one of
  /// this device's binaries, each of which passes check_binary before it is loaded.
  virtual bool is_binary(const std::string& path) const = 0;
  /// Throws unless the file at `path` (shown as `label`) is a binary this host can load;
  /// runs before any of them is loaded, so a mangled file is an error and not a crash.
  virtual void check_binary(const std::string& path, const std::string& label) const = 0;

  /// The compute units this process may use (the CPU: cores), at least 1.
  virtual int32_t compute_units() const = 0;
  /// Throws unless 0 <= device_limit <= compute_units(), naming the limit.
  virtual void check_device_limit(int32_t device_limit) const = 0;
  /// A partition on `units`; throws when a unit is refused (unavailable, negative,
  /// duplicate) or the partition cannot be set up.
  virtual std::unique_ptr<Partition> partition(const std::vector<int32_t>& units) const = 0;

  /// Sets up buffer allocation once per process, so that a bad setting is a load error and
  /// not a run error. Idempotent.
  virtual void prepare_buffers() const = 0;
  /// A new buffer of the device (model.so's outputs and intermediates, via the host table).
  virtual at::Tensor empty_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                                   c10::ScalarType dtype) const = 0;
  /// Waits until work the model queued on the device has finished; a no-op where a run
  /// returns only when its work is done (the CPU).
  virtual void synchronize() const = 0;
};

/// The device that runs archives of `backend` (the manifest's `backend`). Throws
/// aotpack::Error "backend 'npu' is not supported (this runtime runs 'cpu', 'portable' archives)".
const Device& device_for_backend(const std::string& backend);

/// The backend names this runtime runs, in registration order.
std::vector<std::string> backend_names();

/// The device this process itself runs on: it checks the load options that are known
/// before an archive is read (device limit, core set) and backs the host table's buffers.
const Device& host_device();

}  // namespace aotpack::detail
