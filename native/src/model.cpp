// aotpack::Model: verify the archive, extract it, build the constants, load model.so, run.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/InferenceMode.h>
#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <set>

#include "aotpack/runtime.h"
#include "compat.h"
#include "device.h"
#include "extraction.h"
#include "host.h"
#include "manifest.h"
#include "safetensors.h"
#include "signature.h"
#include "tensor_handle.h"

namespace aotpack {

using detail::fail;

namespace {

// ---- model.so ----

class ModelLibrary {
 public:
  aotpack_model_abi_version_fn abi_version = nullptr;
  aotpack_model_create_fn create = nullptr;
  aotpack_model_run_fn run = nullptr;
  aotpack_model_destroy_fn destroy = nullptr;
  aotpack_model_last_error_fn last_error = nullptr;

  /// dlopen(RTLD_NOW | RTLD_LOCAL) and resolve the five exports; throws naming `label`.
  void open(const std::string& path, const std::string& label) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* why = dlerror();
      fail("cannot dlopen " + label + ": " + (why ? why : "unknown error"));
    }
    abi_version = resolve<aotpack_model_abi_version_fn>("aotpack_model_abi_version", label);
    create = resolve<aotpack_model_create_fn>("aotpack_model_create", label);
    run = resolve<aotpack_model_run_fn>("aotpack_model_run", label);
    destroy = resolve<aotpack_model_destroy_fn>("aotpack_model_destroy", label);
    last_error = resolve<aotpack_model_last_error_fn>("aotpack_model_last_error", label);
  }

  /// The model's own last-error message, never NULL.
  std::string error_message() const {
    const char* message = last_error ? last_error() : nullptr;
    return message && *message ? message : "(model.so gave no message)";
  }

  ModelLibrary() = default;
  ModelLibrary(const ModelLibrary&) = delete;
  ModelLibrary& operator=(const ModelLibrary&) = delete;
  ~ModelLibrary() {
    if (handle_) dlclose(handle_);
  }

 private:
  template <class Fn>
  Fn resolve(const char* symbol, const std::string& label) {
    void* address = dlsym(handle_, symbol);
    if (!address) fail(label + " does not export " + symbol);
    return reinterpret_cast<Fn>(address);
  }

  void* handle_ = nullptr;
};

// ---- constants ----

bool same_strides(c10::IntArrayRef shape, c10::IntArrayRef got, c10::IntArrayRef want) {
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && got[d] != want[d]) return false;
  return true;
}

// Alignment of a constant the kernels read in place: a vector load of a GEMM weight panel
// that straddles two cache lines costs more than one that does not (measured: samples/mlp.py
// with GEMM template winners, aotpack-run at 2 threads, 1.17 -> 1.08 ms median). The writer
// (aotpack/archive/weights.py) starts every constant whose size is a multiple of it at such an
// offset; an unaligned constant is copied once at load, into ATen's aligned memory.
constexpr uintptr_t kConstantAlignment = AOTPACK_WEIGHTS_ALIGNMENT;

// A tensor laid out exactly as `spec` says over row-major bytes inside `weights`: the
// mapped bytes themselves when the layout is row-major and the address is 64-byte aligned
// (the mapping is copy-on-write, so in-place updates stay private), else a copy.
at::Tensor tensor_from_bytes(const TensorSpec& spec, const char* bytes,
                             const std::shared_ptr<detail::MappedFile>& weights) {
  const auto options = at::TensorOptions().dtype(spec.dtype);
  at::Tensor row_major_view;
  const auto address = reinterpret_cast<uintptr_t>(bytes);
  if (address % c10::elementSize(spec.dtype) == 0) {  // readable in place: view it, copy from it once
    row_major_view = at::from_blob(const_cast<char*>(bytes), spec.shape,
                                   [keep = weights](void*) mutable { keep.reset(); }, options);
    if (address % kConstantAlignment == 0 && same_strides(spec.shape, row_major_view.strides(), spec.strides))
      return row_major_view;
  }
  at::Tensor tensor = at::empty_strided(spec.shape, spec.strides, options);
  if (tensor.numel() == 0) return tensor;
  if (row_major_view.defined()) {
    tensor.copy_(row_major_view);
    return tensor;
  }
  at::Tensor row_major = at::empty(spec.shape, options);  // unaligned bytes: memcpy first
  std::memcpy(row_major.data_ptr(), bytes,
              static_cast<size_t>(row_major.numel()) * row_major.element_size());
  tensor.copy_(row_major);
  return tensor;
}

// `weights`: weights.safetensors as the extraction mapped it (null when the archive has none).
std::vector<at::Tensor> make_constants(const detail::Manifest& manifest,
                                       const std::shared_ptr<detail::MappedFile>& weights) {
  if (manifest.constants.empty()) return {};
  if (!weights) fail(std::string("the archive has no '") + detail::kWeightsPath + "'");
  std::map<std::string, detail::SafeTensorView> views;
  try {
    views = detail::parse_safetensors(weights->data, weights->size);
  } catch (const Error& e) {
    fail(std::string(detail::kWeightsPath) + ": " + e.what());
  }
  for (const auto& [name, target] : manifest.weight_aliases) {
    if (views.count(name))
      fail("weight alias '" + name + "' is also a tensor in " + detail::kWeightsPath +
           "; a name is either stored or an alias");
    if (!views.count(target))
      fail("weight alias '" + name + "' -> '" + target + "': no such tensor in " + detail::kWeightsPath);
  }
  std::vector<at::Tensor> constants;  // aliases of one tensor view the same mapped bytes
  for (const TensorSpec& spec : manifest.constants) {
    const std::string& stored = detail::stored_name(manifest, spec.name);
    auto it = views.find(stored);
    if (it == views.end())
      fail("constant '" + spec.name + "' is missing from " + detail::kWeightsPath);
    const detail::SafeTensorView& view = it->second;
    if (view.dtype != spec.dtype || view.shape != spec.shape)
      fail("constant '" + spec.name + "'" + (stored == spec.name ? "" : " (stored as '" + stored + "')") +
           ": " AOTPACK_MANIFEST_PATH " says " + describe(spec.dtype, spec.shape) + ", " +
           detail::kWeightsPath + " holds " + describe(view.dtype, view.shape));
    constants.push_back(tensor_from_bytes(spec, view.data, weights));
  }
  return constants;
}

void check_mutated_buffers(const detail::Manifest& manifest) {
  for (const std::string& name : manifest.mutated_buffers) {
    bool found = false;
    for (const TensorSpec& c : manifest.constants) found = found || c.name == name;
    if (!found) fail("mutated buffer '" + name + "' is not among the constants");
  }
  std::set<std::string> targets;
  for (const auto& [alias, target] : manifest.weight_aliases) targets.insert(target);
  for (const std::string& name : manifest.mutated_buffers) {
    if (manifest.weight_aliases.count(name) || targets.count(name))
      fail("mutated buffer '" + name + "' shares its weights with another name (weight_aliases); "
           "a buffer the model writes must be stored on its own");
  }
}

// ---- run-time checks ----

std::string input_label(size_t i, const TensorSpec& spec) {
  return "input " + std::to_string(i) + " ('" + spec.name + "')";
}

// Checks dtype and shape; copies into the manifest's strides when they differ.
at::Tensor prepare_input(const at::Tensor& t, size_t i, const TensorSpec& spec) {
  if (!t.defined()) fail(input_label(i, spec) + ": undefined tensor");
  if (!t.device().is_cpu() || t.layout() != c10::kStrided)
    fail(input_label(i, spec) + ": expected a dense CPU tensor, got " + t.toString());
  if (t.scalar_type() != spec.dtype || !t.sizes().equals(spec.shape))
    fail(input_label(i, spec) + ": expected " + describe(spec.dtype, spec.shape) + ", got " +
         describe(t.scalar_type(), t.sizes().vec()));
  if (same_strides(t.sizes(), t.strides(), spec.strides)) return t;
  at::Tensor copy = at::empty_strided(spec.shape, spec.strides, t.options());
  copy.copy_(t);
  return copy;
}

void check_output(const at::Tensor& t, size_t i, const TensorSpec& spec) {
  // The label is built only on failure: a run pays nothing for its error messages.
  auto label = [&] { return "output " + std::to_string(i) + " ('" + spec.name + "')"; };
  if (!t.defined()) fail(label() + ": model.so returned no tensor");
  if (t.scalar_type() != spec.dtype || !t.sizes().equals(spec.shape))
    fail(label() + ": model.so returned " + describe(t.scalar_type(), t.sizes().vec()) +
         ", the manifest says " + describe(spec.dtype, spec.shape));
}

}  // namespace

// ---- Model::Impl ----

// Hidden: only Model's own members are the library's interface.
struct __attribute__((visibility("hidden"))) Model::Impl {
  // With a core set, every create and run happens on this partition (device.h); declared
  // first so it is stopped after everything below is gone.
  std::unique_ptr<detail::Partition> runner;
  const detail::Device* device = nullptr;  // the manifest's backend's (check_compatibility)
  std::string archive_path;
  std::vector<std::string> warnings;  // Model::warnings()
  detail::Manifest manifest;
  std::vector<at::Tensor> constants;  // manifest order; model.so borrows them
  detail::Extraction dir;  // the verified files; see extraction.h
  ModelLibrary library;  // declared after dir: unloaded before the folder is removed
  void* instance = nullptr;
  std::mutex run_mutex;  // runs are serialised: the model may write its buffers in place
  AotpackRunStats stats{};  // guarded by run_mutex
  SignatureInfo signature;  // from the manifest entries' check

  ~Impl() {
    if (instance) library.destroy(instance);
  }

  void load(const LoadOptions& options);
  void create_instance(int32_t device_limit);
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs);
  std::vector<at::Tensor> run_here(const std::vector<at::Tensor>& inputs);
};

namespace {

// The device limit of a core partition: its size. An explicit device_limit must agree.
int32_t partition_limit(const LoadOptions& options) {
  const auto size = static_cast<int32_t>(options.cores.size());
  if (options.device_limit != 0 && options.device_limit != size)
    fail("device_limit " + std::to_string(options.device_limit) + " and a core set of " +
         std::to_string(size) + " core(s) disagree: with cores the limit is their number " +
         "(leave device_limit 0)");
  return size;
}

}  // namespace

void Model::Impl::load(const LoadOptions& options) {
  // The options are checked on the device this process runs on before the archive is read.
  const detail::Device& host = detail::host_device();
  int32_t device_limit = options.device_limit;
  host.check_device_limit(device_limit);
  host.prepare_buffers();  // a bad AOTPACK_HOST_CACHE_MB is a load error, not a run error
  std::vector<std::string> keys = detail::trusted_key_paths();
  keys.insert(keys.end(), options.trusted_keys.begin(), options.trusted_keys.end());
  if ((options.require_signature || detail::signature_required_by_env()) && keys.empty())
    fail("a signature is required, but no trusted key is set (AOTPACK_TRUSTED_KEYS or "
         "--trusted-key)");
  if (!options.cores.empty()) {
    device_limit = partition_limit(options);
    runner = host.partition(options.cores);  // checks the cores
  }
  // 1. Verified entry by entry (the manifest and its signature before anything is written),
  //    streamed to a private folder, or a cache entry proven file by file; every binary
  //    passes the device's check_binary.
  detail::Extraction::Options extraction;
  extraction.trusted_keys = keys;
  extraction.verify_archive = options.verify_archive;
  extraction.use_cache = !options.private_extraction;
  dir = detail::Extraction::open(archive_path, detail::Limits::from_env(), extraction,
                                 [this](const detail::Manifest& m) {
                                   device = &detail::check_compatibility(m);
                                   check_mutated_buffers(m);
                                 },
                                 &manifest);
  signature = {manifest.signature_state, manifest.signed_by, manifest.signed_by_sha256};
  c10::InferenceMode inference;
  constants = make_constants(manifest, dir.weights());
  // 2. Only now: dlopen, create.
  library.open(dir.path() + "/" + manifest.model_library, manifest.model_library);
  detail::check_model_abi(manifest.model_library, library.abi_version());
  // Default: the build-time limit, capped by the cores available here.
  const int32_t units = device->compute_units();
  if (device_limit == 0 && manifest.device_limit > units) device_limit = units;
  if (!runner) {
    create_instance(device_limit);
  } else {
    if (manifest.device_limit != device_limit)
      warnings.push_back("'" + archive_path + "' was tuned for --device-limit " +
                         std::to_string(manifest.device_limit) + " and is loaded on a partition of " +
                         std::to_string(device_limit) + " core(s); its kernels may run slower: " +
                         "rebuild it with --device-limit " + std::to_string(device_limit));
    runner->call([&] { create_instance(device_limit); });  // load-time ATen work runs pinned too
  }
  // 3. Every check passed: only now may a new extraction become the cache entry (the
  //    loaded libraries keep working when their folder is renamed).
  dir.publish();
}

void Model::Impl::create_instance(int32_t device_limit) {
  std::vector<AotpackTensor> handles;
  for (const at::Tensor& c : constants) handles.push_back(detail::borrow_handle(c));
  int32_t rc = library.create(detail::host_table(), dir.path().c_str(), handles.data(),
                              static_cast<int64_t>(handles.size()), device_limit, &instance);
  if (rc != 0) {
    instance = nullptr;
    fail("aotpack_model_create failed: " + library.error_message());
  }
  if (!instance) fail("aotpack_model_create returned no instance");
}

std::vector<at::Tensor> Model::Impl::run(const std::vector<at::Tensor>& inputs) {
  if (!runner) return run_here(inputs);
  std::vector<at::Tensor> outputs;
  runner->call([&] { outputs = run_here(inputs); });
  return outputs;
}

std::vector<at::Tensor> Model::Impl::run_here(const std::vector<at::Tensor>& inputs) {
  const std::vector<TensorSpec>& in_specs = manifest.inputs;
  const std::vector<TensorSpec>& out_specs = manifest.outputs;
  if (inputs.size() != in_specs.size())
    fail("expected " + std::to_string(in_specs.size()) + " input(s), got " +
         std::to_string(inputs.size()));
  std::lock_guard<std::mutex> lock(run_mutex);
  c10::InferenceMode inference;
  std::vector<at::Tensor> prepared;
  prepared.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    prepared.push_back(prepare_input(inputs[i], i, in_specs[i]));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool same = prepared[i].unsafeGetTensorImpl() == inputs[i].unsafeGetTensorImpl();
    ++(same ? stats.inputs_used : stats.inputs_copied);
  }
  std::vector<AotpackTensor> in_handles;
  in_handles.reserve(prepared.size());
  for (const at::Tensor& t : prepared) in_handles.push_back(detail::borrow_handle(t));
  std::vector<AotpackTensor> out_handles(out_specs.size(), nullptr);
  int32_t rc = library.run(instance, in_handles.data(), static_cast<int64_t>(in_handles.size()),
                           out_handles.data(), static_cast<int64_t>(out_handles.size()));
  std::vector<at::Tensor> outputs;  // take every handle first: nothing leaks on error
  outputs.reserve(out_handles.size());
  for (AotpackTensor h : out_handles) outputs.push_back(h ? detail::take_handle(h) : at::Tensor());
  if (rc != 0) fail("aotpack_model_run failed: " + library.error_message());
  device->synchronize();
  for (size_t i = 0; i < outputs.size(); ++i) check_output(outputs[i], i, out_specs[i]);
  ++stats.runs;
  return outputs;
}

// ---- Model ----

Model Model::load(const std::string& archive_path, int32_t device_limit) {
  LoadOptions options;
  options.device_limit = device_limit;
  return load(archive_path, options);
}

Model Model::load(const std::string& archive_path, const LoadOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->archive_path = archive_path;
  try {
    impl->load(options);
  } catch (const std::exception& e) {
    throw Error("cannot load '" + archive_path + "': " + detail::exception_message(e));
  }
  return Model(std::move(impl));
}

std::vector<at::Tensor> Model::run(const std::vector<at::Tensor>& inputs) {
  if (!impl_) throw Error("run() on a moved-from aotpack::Model");
  try {
    return impl_->run(inputs);
  } catch (const std::exception& e) {
    throw Error("model '" + name() + "' " + version() + ": " + detail::exception_message(e));
  }
}

const std::string& Model::name() const { return impl_->manifest.name; }
const std::string& Model::version() const { return impl_->manifest.version; }
const std::vector<TensorSpec>& Model::inputs() const { return impl_->manifest.inputs; }
const std::vector<TensorSpec>& Model::outputs() const { return impl_->manifest.outputs; }
const std::string& Model::manifest_json() const { return impl_->manifest.text; }
const std::string& Model::archive_path() const { return impl_->archive_path; }
const std::vector<std::string>& Model::warnings() const { return impl_->warnings; }
std::vector<int32_t> Model::cores() const {
  return impl_->runner ? impl_->runner->units() : std::vector<int32_t>{};
}

const SignatureInfo& Model::signature() const { return impl_->signature; }

AotpackRunStats Model::stats() const {
  std::lock_guard<std::mutex> lock(impl_->run_mutex);
  return impl_->stats;
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

}  // namespace aotpack
