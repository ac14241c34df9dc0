// aotpack_model_run_dlpack and aotpack_model_run_torch: the C API's DLPack doors. Inputs
// are adopted in place (at::from_blob over their memory, no copy; their deleter runs when
// the runtime is done with them), or, from a caller sharing this process's libtorch, used
// as the caller's own TensorImpl; outputs are handed out as DLManagedTensorVersioned that
// keep the runtime's at::Tensor alive (no copy either).
#include <ATen/DLConvertor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorImpl.h>

#include <atomic>
#include <memory>
#include <typeinfo>
#include <utility>
#include <vector>

#include "c_api.h"
#include "npy.h"
#include "util.h"

namespace {

using aotpack::detail::fail;

std::atomic<int64_t> g_live_tensors{0};

// One output handed out: the tensor it shares memory with, and the arrays its DLTensor
// points at. Freed by its own deleter.
struct Exported {
  at::Tensor tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensorVersioned managed{};
};

void delete_exported(DLManagedTensorVersioned* self) {
  if (self == nullptr) return;
  delete static_cast<Exported*>(self->manager_ctx);
  g_live_tensors.fetch_sub(1, std::memory_order_relaxed);
}

DLManagedTensorVersioned* export_tensor(at::Tensor tensor) {
  auto owned = std::make_unique<Exported>();
  owned->shape = tensor.sizes().vec();
  owned->strides = tensor.strides().vec();
  DLManagedTensorVersioned& m = owned->managed;
  m.version.major = DLPACK_MAJOR_VERSION;
  m.version.minor = DLPACK_MINOR_VERSION;
  m.flags = 0;
  m.deleter = delete_exported;
  DLTensor& dl = m.dl_tensor;
  dl.data = tensor.numel() > 0 ? tensor.data_ptr() : nullptr;
  dl.device = DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int32_t>(owned->shape.size());
  dl.dtype = at::getDLDataType(tensor);
  dl.shape = owned->shape.data();
  dl.strides = owned->strides.data();
  dl.byte_offset = 0;
  owned->tensor = std::move(tensor);
  m.manager_ctx = owned.get();
  g_live_tensors.fetch_add(1, std::memory_order_relaxed);
  return &owned.release()->managed;
}

std::string describe_dl_dtype(const DLDataType& dtype) {
  return "DLPack dtype (code " + std::to_string(dtype.code) + ", bits " +
         std::to_string(dtype.bits) + ", lanes " + std::to_string(dtype.lanes) + ")";
}

// Calls the deleters of inputs[next..count) on exit: the inputs not yet adopted by a tensor,
// so every input the caller handed over is freed exactly once whatever fails.
class InputOwners {
 public:
  InputOwners(DLManagedTensorVersioned* const* inputs, int64_t count)
      : inputs_(inputs), count_(count) {}
  InputOwners(const InputOwners&) = delete;
  InputOwners& operator=(const InputOwners&) = delete;
  ~InputOwners() {
    for (; next_ < count_; ++next_) {
      DLManagedTensorVersioned* managed = inputs_[next_];
      if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
    }
  }
  /// The next input, now the caller's to own (or to free).
  DLManagedTensorVersioned* take() { return inputs_[next_++]; }

 private:
  DLManagedTensorVersioned* const* inputs_;
  int64_t count_;
  int64_t next_ = 0;
};

void call_deleter(void* context) {
  auto* managed = static_cast<DLManagedTensorVersioned*>(context);
  if (managed->deleter != nullptr) managed->deleter(managed);
}

// "model 'mlp' 0.1.0: input 0 ('x')": built only when a check fails, so a run pays nothing
// for its error messages.
std::string input_label(const aotpack::Model& model, int64_t i) {
  const std::vector<aotpack::TensorSpec>& specs = model.inputs();
  const std::string name =
      i < static_cast<int64_t>(specs.size()) ? " ('" + specs[i].name + "')" : "";
  return "model '" + model.name() + "' " + model.version() + ": input " + std::to_string(i) + name;
}

// `managed` as an at::Tensor over the same memory (no copy) that owns it: its deleter runs
// when the last tensor using that memory is freed (an output may view an input). On error
// the deleter runs at once. Throws naming the input.
at::Tensor adopt_input(DLManagedTensorVersioned* managed, const aotpack::Model& model, int64_t i) {
  auto bad = [&](const std::string& what) { fail(input_label(model, i) + ": " + what); };
  if (managed == nullptr) bad("NULL DLManagedTensorVersioned");
  std::unique_ptr<DLManagedTensorVersioned, void (*)(DLManagedTensorVersioned*)> owner(
      managed, [](DLManagedTensorVersioned* m) { call_deleter(m); });
  if (managed->version.major != DLPACK_MAJOR_VERSION)
    bad("DLPack version " + std::to_string(managed->version.major) + "." +
        std::to_string(managed->version.minor) + " is not supported (this runtime reads " +
        std::to_string(DLPACK_MAJOR_VERSION) + ".x)");
  const DLTensor& dl = managed->dl_tensor;
  if (dl.device.device_type != kDLCPU)
    bad("expected a CPU tensor (kDLCPU), got DLPack device type " +
        std::to_string(static_cast<int>(dl.device.device_type)));
  if (dl.ndim < 0) bad("negative ndim " + std::to_string(dl.ndim));
  if (dl.ndim > 0 && dl.shape == nullptr) bad("NULL shape");
  c10::ScalarType dtype;
  try {
    dtype = at::toScalarType(dl.dtype);
  } catch (const std::exception&) {
    bad(describe_dl_dtype(dl.dtype) + " has no torch dtype");
  }
  const c10::IntArrayRef shape(dl.shape, static_cast<size_t>(dl.ndim));
  std::vector<int64_t> row_major;  // DLPack < 1.2: NULL strides mean compact row-major
  if (dl.strides == nullptr) {
    row_major.resize(static_cast<size_t>(dl.ndim));
    int64_t step = 1;
    for (int64_t d = dl.ndim - 1; d >= 0; --d) {
      row_major[d] = step;
      step *= shape[d];
    }
  }
  const c10::IntArrayRef strides = dl.strides != nullptr
                                       ? c10::IntArrayRef(dl.strides, static_cast<size_t>(dl.ndim))
                                       : c10::IntArrayRef(row_major);
  for (int64_t d = 0; d < dl.ndim; ++d)
    if (strides[d] < 0) bad("negative strides are not supported; pass a copy");
  char* data = static_cast<char*>(dl.data) + dl.byte_offset;
  // A context and a plain function pointer, not a std::function deleter: one allocation less.
  at::Tensor tensor = at::for_blob(data, shape)
                          .strides(strides)
                          .context(managed, call_deleter)
                          .options(at::TensorOptions().dtype(dtype))
                          .make_tensor();
  owner.release();  // the tensor's storage owns it now
  return tensor;
}

// Fills `outputs` with DLPack exports of `ys` (all or none: on error none is handed out).
void hand_out(std::vector<at::Tensor>& ys, DLManagedTensorVersioned** outputs) {
  std::vector<DLManagedTensorVersioned*> exported;
  exported.reserve(ys.size());
  try {
    for (at::Tensor& y : ys) exported.push_back(export_tensor(std::move(y)));
  } catch (...) {
    for (DLManagedTensorVersioned* e : exported) delete_exported(e);
    throw;
  }
  for (size_t i = 0; i < exported.size(); ++i) outputs[i] = exported[i];
}

// "model 'mlp' 0.1.0: " for the checks of the run entry points.
std::string model_prefix(const aotpack::Model& m) {
  return "model '" + m.name() + "' " + m.version() + ": ";
}

void check_output_slots(const aotpack::Model& m, DLManagedTensorVersioned** outputs,
                        int64_t num_outputs) {
  const int64_t expected = static_cast<int64_t>(m.outputs().size());
  if (num_outputs != expected || (num_outputs > 0 && outputs == nullptr))
    fail(model_prefix(m) + "the model has " + std::to_string(expected) +
         " output(s), the caller passed " + std::to_string(num_outputs) + " slot(s)");
}

// A TensorImpl the run can use as it is: a plain dense CPU tensor with storage, none of the
// bits a DLPack export refuses (conjugate, negative, zero tensor) and no autograd or
// Python-dispatch state. Wrapper impls (sparse, batched, functional, nested) are subclasses.
bool plain_cpu_tensor(const c10::TensorImpl& t) {
  return typeid(t) == typeid(c10::TensorImpl) && t.device_type() == c10::DeviceType::CPU &&
         t.layout() == c10::kStrided && t.has_storage() && !t.is_conj() && !t.is_neg() &&
         !t._is_zerotensor() && !t.requires_grad() && !t.is_python_dispatch();
}

}  // namespace

extern "C" {

int32_t aotpack_model_run_torch(aotpack_model_t* model, void* const* inputs, int64_t num_inputs,
                                DLManagedTensorVersioned** outputs, int64_t num_outputs) {
  for (int64_t i = 0; outputs != nullptr && i < num_outputs; ++i) outputs[i] = nullptr;
  for (int64_t i = 0; inputs != nullptr && i < num_inputs; ++i) {
    const auto* t = static_cast<const c10::TensorImpl*>(inputs[i]);
    if (t != nullptr && !plain_cpu_tensor(*t)) {
      aotpack::detail::c_api_last_error() =
          "input " + std::to_string(i) + " is not a plain dense CPU tensor; pass it by DLPack";
      return AOTPACK_STATUS_NOT_PLAIN;
    }
  }
  return aotpack::detail::c_api_guarded([&] {
    if (model == nullptr) fail("NULL model handle");
    aotpack::Model& m = model->model;
    if (num_inputs < 0 || (num_inputs > 0 && inputs == nullptr))
      fail(model_prefix(m) + "bad input array");
    check_output_slots(m, outputs, num_outputs);
    std::vector<at::Tensor> xs;
    xs.reserve(static_cast<size_t>(num_inputs));
    for (int64_t i = 0; i < num_inputs; ++i) {
      auto* t = static_cast<c10::TensorImpl*>(inputs[i]);
      if (t == nullptr) fail(input_label(m, i) + ": NULL tensor");
      // a reference of our own: an output that views the input keeps it alive
      xs.emplace_back(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::
                          unsafe_reclaim_from_nonowning(t));
    }
    std::vector<at::Tensor> ys = m.run(xs);  // checks count, dtype and shape
    xs.clear();
    hand_out(ys, outputs);
  });
}

int32_t aotpack_model_run_dlpack(aotpack_model_t* model, DLManagedTensorVersioned* const* inputs,
                                 int64_t num_inputs, DLManagedTensorVersioned** outputs,
                                 int64_t num_outputs) {
  for (int64_t i = 0; outputs != nullptr && i < num_outputs; ++i) outputs[i] = nullptr;
  return aotpack::detail::c_api_guarded([&] {
    if (num_inputs < 0 || (num_inputs > 0 && inputs == nullptr))
      fail(model == nullptr ? std::string("NULL model handle")
                            : "model '" + model->model.name() + "' " + model->model.version() +
                                  ": bad input array");
    // Every input is owned from here on, whatever happens next (also a wrong model handle
    // or output count: the consumer rule of runtime.h).
    InputOwners owners(inputs, num_inputs);
    if (model == nullptr) fail("NULL model handle");
    aotpack::Model& m = model->model;
    check_output_slots(m, outputs, num_outputs);
    std::vector<at::Tensor> xs;
    xs.reserve(static_cast<size_t>(num_inputs));
    {
      c10::InferenceMode inference;  // the adopted views need no autograd metadata
      for (int64_t i = 0; i < num_inputs; ++i) xs.push_back(adopt_input(owners.take(), m, i));
    }
    std::vector<at::Tensor> ys = m.run(xs);  // checks count, dtype and shape
    hand_out(ys, outputs);
  });
}

int64_t aotpack_dlpack_live_tensors(void) {
  return g_live_tensors.load(std::memory_order_relaxed);
}

int32_t aotpack_npy_load(const char* path, DLManagedTensorVersioned** out) {
  return aotpack::detail::c_api_guarded([&] {
    if (out == nullptr) fail("NULL output pointer");
    *out = nullptr;
    if (path == nullptr) fail("NULL path");
    *out = export_tensor(aotpack::npy::read(path));
  });
}

}  // extern "C"
