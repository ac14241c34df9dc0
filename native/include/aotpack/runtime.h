/* aotpack/runtime.h: load a .aotpack archive and run it, without Python.
 *
 * Two layers over one implementation:
 *   - a C API for FFI (ctypes, Rust, Go, ...): opaque handles, int32_t status (0 = ok,
 *     non-zero = error), results through trailing pointer parameters, and the message of
 *     the last failure on this thread from aotpack_last_error(). No C++ exception crosses it.
 *   - a thin C++ API (namespace aotpack, below, C++ only) over at::Tensor that throws
 *     aotpack::Error. Define AOTPACK_RUNTIME_C_ONLY before including this header to get the
 *     C API alone (no libtorch headers needed then).
 *
 * Tensors cross the C API as AotpackTensor (model_abi.h): an at::Tensor* in disguise, so
 * C++ callers may cast between the two. Handles the API returns are owned by the caller
 * and freed with aotpack_tensor_free(); handles the caller passes in are borrowed.
 *
 * Threading: a model may be used from several threads; runs of one model are serialised
 * (the model may write its buffers in place). Separate models run in parallel.
 */
#ifndef AOTPACK_RUNTIME_H
#define AOTPACK_RUNTIME_H

#include <stdint.h>

#include "aotpack/dlpack.h"
#include "aotpack/model_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded model: the verified, extracted archive, its constants and the model.so instance. */
typedef struct aotpack_model aotpack_model_t;

/* One tensor of a model's signature. Every pointer stays valid while the model lives. */
typedef struct AotpackTensorSpec {
  const char* name;       /* as in the manifest, NUL-terminated                */
  int32_t dtype;          /* an AotpackDType code                              */
  int64_t ndim;           /* number of dimensions                              */
  const int64_t* shape;   /* ndim sizes, in elements                           */
  const int64_t* strides; /* ndim strides, in elements                         */
} AotpackTensorSpec;

/* Message of the last failed call of this API on this thread ("" if none). Valid until the
 * next failing call on the same thread. Never NULL. */
AOTPACK_EXPORT const char* aotpack_last_error(void);

/* Verify, extract and load an archive.
 *   archive:      path of the .aotpack file
 *   device_limit: cores the kernels may use; 0 = the limit recorded at build time
 *   out:          receives the model; free it with aotpack_model_free()
 * Every check (paths, sizes, sha256, torch version, CPU features, ABI version) happens
 * before anything is written to disk or dlopen'ed. Errors name the archive and the problem. */
AOTPACK_EXPORT int32_t aotpack_model_load(const char* archive, int32_t device_limit,
                                          aotpack_model_t** out);

/* Options of aotpack_model_load_with(). Zero the struct (a zero field is its default), set
 * struct_size = sizeof(AotpackLoadOptions), then the fields you need. Fields are only ever
 * appended: a runtime reads the first struct_size bytes, and refuses a larger struct whose
 * bytes past its own fields are not all zero (options it does not know). */
typedef struct AotpackLoadOptions {
  uint32_t struct_size;            /* sizeof(AotpackLoadOptions) of the caller's header     */
  int32_t device_limit;            /* cores the kernels may use; 0 = build-time limit       */
  const char* const* trusted_keys; /* Ed25519 public keys (PEM file paths), added to those  */
  int64_t num_trusted_keys;        /*   of AOTPACK_TRUSTED_KEYS; any key requires a signature */
  int32_t verify_archive;          /* 1: read and check every byte of the archive, even
                                      when its extraction-cache entry exists (--check)      */
  int32_t require_signature;       /* 1: refuse unless trusted keys are set (and so the
                                      archive carries a valid signature by one of them);
                                      AOTPACK_REQUIRE_SIGNATURE=1 sets it for every load    */
  const int32_t* cores;            /* CPU ids of the core partition the model's threads run */
  int64_t num_cores;               /*   on; NULL / 0 = not pinned                           */
  int32_t private_extraction;      /* 1: extract to a private folder removed at free; the
                                      extraction cache is neither read nor written          */
} AotpackLoadOptions;

/* aotpack_model_load with options (NULL = all defaults). Same checks and errors. */
AOTPACK_EXPORT int32_t aotpack_model_load_with(const char* archive,
                                               const AotpackLoadOptions* options,
                                               aotpack_model_t** out);

/* Problems found at load that did not stop it (e.g. an archive tuned for --device-limit 2
 * loaded on a 1-core partition), one per line; "" when none. Valid while the model lives. */
AOTPACK_EXPORT int32_t aotpack_model_warnings(const aotpack_model_t* model, const char** out);

/* Destroy the model instance, unload its libraries and remove its temp folder. NULL is ok. */
AOTPACK_EXPORT void aotpack_model_free(aotpack_model_t* model);

/* Run once.
 *   inputs:  num_inputs borrowed CPU tensors in manifest order; dtype and shape must match
 *            the manifest exactly (strides that differ are copied into the manifest layout)
 *   outputs: num_outputs slots, each receives a new tensor to free with aotpack_tensor_free()
 * On error no output is written (every slot is NULL). */
AOTPACK_EXPORT int32_t aotpack_model_run(aotpack_model_t* model, const AotpackTensor* inputs,
                                         int64_t num_inputs, AotpackTensor* outputs,
                                         int64_t num_outputs);

/* Run once on DLPack tensors (DLPack 1.x, https://dmlc.github.io/dlpack/latest/).
 *   inputs:  num_inputs DLManagedTensorVersioned in manifest order. The runtime takes
 *            ownership of each (the DLPack consumer rule), also on error: it calls the
 *            deleter once it no longer needs the memory, at the end of the call or later
 *            while an output that views the input lives. Each must be on kDLCPU with
 *            major version 1, the manifest's dtype and exactly its shape; strides NULL
 *            means row-major. An input whose strides match the manifest's (dimensions of
 *            size 1 aside) is used in place, without a copy; other strides are copied into
 *            the manifest layout. Negative strides are refused. To keep using a tensor
 *            after the call, pass a DLManagedTensorVersioned whose deleter does not free it.
 *   outputs: num_outputs slots, each receives a new DLManagedTensorVersioned (version
 *            1.DLPACK_MINOR_VERSION, flags 0) that shares the output tensor's memory: no
 *            copy is made. The receiver owns it and calls its deleter once; it may outlive
 *            the model. As in eager PyTorch, an output may share memory with an input or a
 *            model constant when the model returns a view of one.
 * On error no output is written (every slot is NULL). Thread-safety as aotpack_model_run. */
AOTPACK_EXPORT int32_t aotpack_model_run_dlpack(aotpack_model_t* model,
                                                DLManagedTensorVersioned* const* inputs,
                                                int64_t num_inputs,
                                                DLManagedTensorVersioned** outputs,
                                                int64_t num_outputs);

/* aotpack_model_run_torch's status for an input it does not take as it is (nothing ran,
 * no output was written): pass that run's inputs by DLPack instead. */
#define AOTPACK_STATUS_NOT_PLAIN 2

/* Run once on the caller's own torch tensors, for an in-process caller that shares this
 * runtime's libtorch (one process loads one libtorch, so a Python caller with torch
 * imported does): no DLPack export per input (aotpack.load's fast path, ~3 us less per
 * input from Python).
 *   inputs:  num_inputs c10::TensorImpl* in manifest order, borrowed: the caller keeps each
 *            alive during the call; the runtime holds a reference of its own while it needs
 *            one (also while an output views the input). Each must be a plain dense CPU
 *            tensor (no subclass impl, conjugate or negative bit, autograd or Python
 *            dispatch), else the call returns AOTPACK_STATUS_NOT_PLAIN before anything
 *            runs. Dtype, shape and strides as aotpack_model_run_dlpack (other strides are
 *            copied; the model may write an input it mutates in place).
 *   outputs: as aotpack_model_run_dlpack.
 * On error no output is written (every slot is NULL). Thread-safety as aotpack_model_run. */
AOTPACK_EXPORT int32_t aotpack_model_run_torch(aotpack_model_t* model, void* const* inputs,
                                               int64_t num_inputs,
                                               DLManagedTensorVersioned** outputs,
                                               int64_t num_outputs);

/* Counters of one model since it was loaded, for diagnostics and tests. */
typedef struct AotpackRunStats {
  int64_t runs;            /* runs that completed successfully                        */
  int64_t inputs_used;     /* inputs passed to model.so as they came (no copy)        */
  int64_t inputs_copied;   /* inputs copied into the manifest layout first            */
} AotpackRunStats;

AOTPACK_EXPORT int32_t aotpack_model_stats(const aotpack_model_t* model, AotpackRunStats* out);

/* DLManagedTensorVersioned this runtime handed out (all models) whose deleter has not run
 * yet: a leak check for callers of aotpack_model_run_dlpack. */
AOTPACK_EXPORT int64_t aotpack_dlpack_live_tensors(void);

/* Manifest accessors. Strings stay valid while the model lives. */
AOTPACK_EXPORT int32_t aotpack_model_name(const aotpack_model_t* model, const char** out);
AOTPACK_EXPORT int32_t aotpack_model_version(const aotpack_model_t* model, const char** out);
/* The whole manifest.json text, for anything the accessors do not cover. */
AOTPACK_EXPORT int32_t aotpack_model_manifest_json(const aotpack_model_t* model, const char** out);
AOTPACK_EXPORT int32_t aotpack_model_num_inputs(const aotpack_model_t* model, int64_t* out);
AOTPACK_EXPORT int32_t aotpack_model_num_outputs(const aotpack_model_t* model, int64_t* out);
/* Signature of input / output `index` (0-based); an error if index is out of range. */
AOTPACK_EXPORT int32_t aotpack_model_input_spec(const aotpack_model_t* model, int64_t index,
                                                AotpackTensorSpec* out);
AOTPACK_EXPORT int32_t aotpack_model_output_spec(const aotpack_model_t* model, int64_t index,
                                                 AotpackTensorSpec* out);

/* New CPU tensor for FFI callers.
 *   dtype:   an AotpackDType code
 *   sizes:   ndim sizes; strides: ndim strides in elements, or NULL for row-major
 *   data:    numel * itemsize bytes in row-major order copied into the tensor, or NULL to
 *            leave it uninitialised
 *   out:     receives the tensor; free it with aotpack_tensor_free() */
AOTPACK_EXPORT int32_t aotpack_tensor_new(int32_t dtype, int64_t ndim, const int64_t* sizes,
                                          const int64_t* strides, const void* data,
                                          AotpackTensor* out);

/* Describe a tensor. Any out pointer may be NULL. sizes/strides point into the tensor and
 * stay valid while it lives; data is the address of its first element. */
AOTPACK_EXPORT int32_t aotpack_tensor_info(AotpackTensor tensor, int32_t* dtype, int64_t* ndim,
                                           const int64_t** sizes, const int64_t** strides,
                                           void** data);

/* Free a tensor returned by this API. NULL is ok. */
AOTPACK_EXPORT void aotpack_tensor_free(AotpackTensor tensor);

/* Read a .npy file (numpy's format 1.0-3.0) into a new CPU tensor, with the checks
 * aotpack-run and `aotpack run` use for their inputs (they call this reader).
 *   path: a regular file holding one little-endian array of dtype <f4 <f8 <f2 <i8 <i4 <i2
 *         |i1 |u1 or |b1 (bool bytes 0 or 1), C or Fortran order, at most 64 dimensions and
 *         a header of at most 1 MiB. Its data must fill the rest of the file exactly.
 *   out:  receives a row-major DLManagedTensorVersioned (as aotpack_model_run_dlpack's
 *         outputs; 0-dim arrays stay 0-dim) to pass to aotpack_model_run_dlpack or free
 *         with its deleter.
 * Memory is allocated only after the header's size matched the file's: a small file
 * claiming a huge shape is refused before anything is allocated. Errors are one line
 * naming the path and the problem (empty file, not a regular file, a zip/.npz, bad magic,
 * big-endian or unsupported dtype, structured array, malformed or truncated header, shape
 * too large, data size that differs from the file's). */
AOTPACK_EXPORT int32_t aotpack_npy_load(const char* path, DLManagedTensorVersioned** out);

/* What aotpack_model_signature reports about an archive's manifest.sig. */
#define AOTPACK_SIGNATURE_NONE 0      /* unsigned: the archive holds no manifest.sig        */
#define AOTPACK_SIGNATURE_UNCHECKED 1 /* signed, but not checked: no trusted key was set     */
#define AOTPACK_SIGNATURE_VERIFIED 2  /* a valid signature by one of the trusted keys       */

/* Whether the archive was signed and by which key, as checked at load. Any out pointer may
 * be NULL; strings stay valid while the model lives.
 *   state:      an AOTPACK_SIGNATURE_* value
 *   key_path:   VERIFIED: the trusted key's path as it was given (AOTPACK_TRUSTED_KEYS or
 *               AotpackLoadOptions.trusted_keys; the first key that verifies); else ""
 *   key_sha256: VERIFIED: the key's fingerprint, the hex sha256 of its DER
 *               SubjectPublicKeyInfo (`openssl pkey -pubin -in KEY.pub.pem -outform DER |
 *               sha256sum`); else "" */
AOTPACK_EXPORT int32_t aotpack_model_signature(const aotpack_model_t* model, int32_t* state,
                                               const char** key_path, const char** key_sha256);

#ifdef __cplusplus
} /* extern "C" */
#endif

#if defined(__cplusplus) && !defined(AOTPACK_RUNTIME_C_ONLY)

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "aotpack/types.h"

namespace aotpack {

/// How Model::load verifies and places a model (the C API's AotpackLoadOptions).
struct LoadOptions {
  /// Cores the kernels may use; 0 = the limit recorded at build time.
  int32_t device_limit = 0;
  /// Ed25519 public keys (PEM file paths), in addition to AOTPACK_TRUSTED_KEYS's.
  std::vector<std::string> trusted_keys;
  /// Read and check every byte of the archive even when its extraction-cache entry exists.
  bool verify_archive = false;
  /// Refuse the load unless trusted keys are set (so a valid signature is required);
  /// AOTPACK_REQUIRE_SIGNATURE=1 sets it for every load.
  bool require_signature = false;
  /// CPU ids of the core partition the model's threads run on; empty = not pinned.
  std::vector<int32_t> cores;
  /// Extract to a private folder removed when the model is freed; the extraction cache is
  /// neither read nor written (a build's own check of its archive).
  bool private_extraction = false;
};

/// How a loaded archive was signed (the C API's aotpack_model_signature).
struct SignatureInfo {
  /// AOTPACK_SIGNATURE_NONE, _UNCHECKED (signed, no trusted key set) or _VERIFIED.
  int32_t state = AOTPACK_SIGNATURE_NONE;
  /// VERIFIED: the trusted key's path as given; else empty.
  std::string key_path;
  /// VERIFIED: hex sha256 of the key's DER SubjectPublicKeyInfo; else empty.
  std::string key_sha256;
};

/// A loaded .aotpack model. Move-only; destroying it unloads model.so and removes the
/// private folder the archive was extracted to.
///
///   aotpack::Model m = aotpack::Model::load("mlp-0.1.0.aotpack");
///   std::vector<at::Tensor> ys = m.run(xs);
class AOTPACK_EXPORT Model {
 public:
  /// Verify, extract and load `archive_path` (see aotpack_model_load for the checks).
  /// device_limit: cores the kernels may use, 0 = the limit recorded at build time.
  /// Throws aotpack::Error naming the archive and the problem.
  static Model load(const std::string& archive_path, int32_t device_limit = 0);
  /// load() with options (LoadOptions). Throws aotpack::Error as load().
  static Model load(const std::string& archive_path, const LoadOptions& options);

  /// Run once. inputs: CPU tensors in manifest order whose dtype and shape match inputs()
  /// exactly; strides that differ from the manifest are copied into its layout first.
  /// Returns one tensor per output, in manifest order. Outputs are created under
  /// c10::InferenceMode (clone() them to modify them in place outside of it).
  /// Throws aotpack::Error naming the model and the failing input, output or step.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs);

  const std::string& name() const;
  const std::string& version() const;
  const std::vector<TensorSpec>& inputs() const;
  const std::vector<TensorSpec>& outputs() const;
  /// The whole manifest.json text.
  const std::string& manifest_json() const;
  /// The path given to load().
  const std::string& archive_path() const;
  /// Problems found at load that do not stop it, one line each (e.g. an archive tuned for
  /// --device-limit 2 loaded on a 1-core partition).
  const std::vector<std::string>& warnings() const;
  /// The core partition the model's threads are pinned to (sorted), empty when not pinned.
  std::vector<int32_t> cores() const;
  /// Counters since load (see AotpackRunStats).
  AotpackRunStats stats() const;
  /// Whether the archive was signed and by which key (see aotpack_model_signature).
  const SignatureInfo& signature() const;

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model();

  struct Impl;

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Reads a .npy file into a new row-major CPU tensor (the reader and checks of
/// aotpack_npy_load; a 0-dim array stays 0-dim). Throws aotpack::Error naming the path.
AOTPACK_EXPORT at::Tensor load_npy(const std::string& path);

}  // namespace aotpack

#endif /* __cplusplus && !AOTPACK_RUNTIME_C_ONLY */

#endif /* AOTPACK_RUNTIME_H */
