// The C API of runtime.h: a shell over aotpack::Model that never lets an exception out.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "aotpack/runtime.h"
#include "c_api.h"
#include "dtype.h"
#include "host.h"
#include "tensor_handle.h"

std::string& aotpack::detail::c_api_last_error() {
  thread_local std::string message;
  return message;
}

namespace {

using aotpack::detail::fail;

// Runs `body`; maps any exception to status 1 and aotpack_last_error().
template <class Body>
int32_t guarded(Body&& body) noexcept {
  return aotpack::detail::c_api_guarded(std::forward<Body>(body));
}

const aotpack::Model& model_of(const aotpack_model_t* model) {
  if (model == nullptr) fail("NULL model handle");
  return model->model;
}

template <class T>
T* checked_out(T* out) {
  if (out == nullptr) fail("NULL output pointer");
  return out;
}

void fill_spec(const aotpack::TensorSpec& spec, AotpackTensorSpec* out) {
  out->name = spec.name.c_str();
  out->dtype = static_cast<int32_t>(spec.dtype);
  out->ndim = static_cast<int64_t>(spec.shape.size());
  out->shape = spec.shape.data();
  out->strides = spec.strides.data();
}

const aotpack::TensorSpec& spec_at(const std::vector<aotpack::TensorSpec>& specs, int64_t index,
                                   const char* what) {
  if (index < 0 || index >= static_cast<int64_t>(specs.size()))
    fail(std::string(what) + " index " + std::to_string(index) + " out of range (the model has " +
         std::to_string(specs.size()) + ")");
  return specs[static_cast<size_t>(index)];
}

std::vector<int64_t> dims(int64_t ndim, const int64_t* values, const char* what) {
  if (ndim < 0) fail("negative ndim");
  if (ndim > 0 && values == nullptr) fail(std::string("NULL ") + what);
  return std::vector<int64_t>(values, values + ndim);
}

// The caller's AotpackLoadOptions as LoadOptions: a struct from an older header is read up
// to its struct_size; one from a newer header may not set options this runtime lacks.
aotpack::LoadOptions load_options(const AotpackLoadOptions* given) {
  aotpack::LoadOptions options;
  if (given == nullptr) return options;
  constexpr size_t kPrefix = offsetof(AotpackLoadOptions, device_limit) + sizeof(int32_t);
  if (given->struct_size < kPrefix)
    fail("AotpackLoadOptions.struct_size is " + std::to_string(given->struct_size) +
         ": set it to sizeof(AotpackLoadOptions)");
  AotpackLoadOptions o{};
  std::memcpy(&o, given, std::min<size_t>(given->struct_size, sizeof(o)));
  const auto* bytes = reinterpret_cast<const unsigned char*>(given);
  for (size_t i = sizeof(o); i < given->struct_size; ++i)
    if (bytes[i] != 0)
      fail("AotpackLoadOptions sets options this runtime does not know (struct_size " +
           std::to_string(given->struct_size) + " > " + std::to_string(sizeof(o)) +
           "): use a newer runtime");
  options.device_limit = o.device_limit;
  if (o.num_trusted_keys < 0 || (o.num_trusted_keys > 0 && o.trusted_keys == nullptr))
    fail("bad trusted key array");
  for (int64_t i = 0; i < o.num_trusted_keys; ++i) {
    if (o.trusted_keys[i] == nullptr || o.trusted_keys[i][0] == '\0')
      fail("trusted key " + std::to_string(i) + " is an empty path");
    options.trusted_keys.emplace_back(o.trusted_keys[i]);
  }
  options.verify_archive = o.verify_archive != 0;
  options.require_signature = o.require_signature != 0;
  if (o.num_cores < 0 || (o.num_cores > 0 && o.cores == nullptr)) fail("bad core array");
  options.cores.assign(o.cores, o.cores + o.num_cores);
  options.private_extraction = o.private_extraction != 0;
  return options;
}

}  // namespace

extern "C" {

const char* aotpack_last_error(void) { return aotpack::detail::c_api_last_error().c_str(); }

int32_t aotpack_model_load(const char* archive, int32_t device_limit, aotpack_model_t** out) {
  return guarded([&] {
    checked_out(out);
    *out = nullptr;
    if (archive == nullptr) fail("NULL archive path");
    *out = aotpack::detail::new_model_handle(aotpack::Model::load(archive, device_limit));
  });
}

int32_t aotpack_model_load_with(const char* archive, const AotpackLoadOptions* options,
                                aotpack_model_t** out) {
  return guarded([&] {
    checked_out(out);
    *out = nullptr;
    if (archive == nullptr) fail("NULL archive path");
    *out = aotpack::detail::new_model_handle(aotpack::Model::load(archive, load_options(options)));
  });
}

void aotpack_model_free(aotpack_model_t* model) { delete model; }

int32_t aotpack_model_run(aotpack_model_t* model, const AotpackTensor* inputs, int64_t num_inputs,
                          AotpackTensor* outputs, int64_t num_outputs) {
  for (int64_t i = 0; outputs != nullptr && i < num_outputs; ++i) outputs[i] = nullptr;
  return guarded([&] {
    if (model == nullptr) fail("NULL model handle");
    if (num_inputs < 0 || (num_inputs > 0 && inputs == nullptr)) fail("bad input array");
    const int64_t expected = static_cast<int64_t>(model->model.outputs().size());
    if (num_outputs != expected || (num_outputs > 0 && outputs == nullptr))
      fail("the model has " + std::to_string(expected) + " output(s), the caller passed " +
           std::to_string(num_outputs) + " slot(s)");
    std::vector<at::Tensor> xs;
    for (int64_t i = 0; i < num_inputs; ++i) xs.push_back(aotpack::detail::unwrap(inputs[i]));
    std::vector<at::Tensor> ys = model->model.run(xs);
    for (size_t i = 0; i < ys.size(); ++i)
      outputs[i] = aotpack::detail::new_handle(std::move(ys[i]));
  });
}

int32_t aotpack_model_name(const aotpack_model_t* model, const char** out) {
  return guarded([&] { *checked_out(out) = model_of(model).name().c_str(); });
}

int32_t aotpack_model_warnings(const aotpack_model_t* model, const char** out) {
  return guarded([&] {
    model_of(model);
    *checked_out(out) = model->warnings.c_str();
  });
}

int32_t aotpack_model_version(const aotpack_model_t* model, const char** out) {
  return guarded([&] { *checked_out(out) = model_of(model).version().c_str(); });
}

int32_t aotpack_model_manifest_json(const aotpack_model_t* model, const char** out) {
  return guarded([&] { *checked_out(out) = model_of(model).manifest_json().c_str(); });
}

int32_t aotpack_model_num_inputs(const aotpack_model_t* model, int64_t* out) {
  return guarded([&] { *checked_out(out) = model_of(model).inputs().size(); });
}

int32_t aotpack_model_num_outputs(const aotpack_model_t* model, int64_t* out) {
  return guarded([&] { *checked_out(out) = model_of(model).outputs().size(); });
}

int32_t aotpack_model_stats(const aotpack_model_t* model, AotpackRunStats* out) {
  return guarded([&] { *checked_out(out) = model_of(model).stats(); });
}

int32_t aotpack_model_input_spec(const aotpack_model_t* model, int64_t index,
                                 AotpackTensorSpec* out) {
  return guarded(
      [&] { fill_spec(spec_at(model_of(model).inputs(), index, "input"), checked_out(out)); });
}

int32_t aotpack_model_output_spec(const aotpack_model_t* model, int64_t index,
                                  AotpackTensorSpec* out) {
  return guarded(
      [&] { fill_spec(spec_at(model_of(model).outputs(), index, "output"), checked_out(out)); });
}

int32_t aotpack_tensor_new(int32_t dtype, int64_t ndim, const int64_t* sizes,
                           const int64_t* strides, const void* data, AotpackTensor* out) {
  return guarded([&] {
    checked_out(out);
    *out = nullptr;
    if (!aotpack::detail::is_supported_dtype_code(dtype))
      fail("unsupported dtype code " + std::to_string(dtype));
    const auto options = at::TensorOptions().dtype(static_cast<c10::ScalarType>(dtype));
    const std::vector<int64_t> shape = dims(ndim, sizes, "sizes");
    at::Tensor row_major = at::empty(shape, options);
    if (data != nullptr && row_major.numel() > 0)
      std::memcpy(row_major.data_ptr(), data, row_major.numel() * row_major.element_size());
    if (strides == nullptr) {
      *out = aotpack::detail::new_handle(std::move(row_major));
      return;
    }
    at::Tensor strided = at::empty_strided(shape, dims(ndim, strides, "strides"), options);
    if (data != nullptr) strided.copy_(row_major);
    *out = aotpack::detail::new_handle(std::move(strided));
  });
}

int32_t aotpack_tensor_info(AotpackTensor tensor, int32_t* dtype, int64_t* ndim,
                            const int64_t** sizes, const int64_t** strides, void** data) {
  return guarded([&] {
    const at::Tensor& t = aotpack::detail::unwrap(tensor);
    if (dtype) *dtype = static_cast<int32_t>(t.scalar_type());
    if (ndim) *ndim = t.dim();
    if (sizes) *sizes = t.sizes().data();
    if (strides) *strides = t.strides().data();
    if (data) *data = t.data_ptr();
  });
}

void aotpack_tensor_free(AotpackTensor tensor) { aotpack::detail::release_handle(tensor); }

int32_t aotpack_model_signature(const aotpack_model_t* model, int32_t* state,
                                const char** key_path, const char** key_sha256) {
  return guarded([&] {
    const aotpack::SignatureInfo& info = model_of(model).signature();
    if (state) *state = info.state;
    if (key_path) *key_path = info.key_path.c_str();
    if (key_sha256) *key_sha256 = info.key_sha256.c_str();
  });
}

}  // extern "C"
