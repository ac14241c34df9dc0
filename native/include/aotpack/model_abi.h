/* aotpack model ABI: the C contract between a generated model.so and the runtime.
 *
 * Calling convention (every entry point):
 *   - returns int32_t status: 0 = ok, non-zero = error; the message is then available
 *     from the matching *_last_error() (thread-local, valid until the next call);
 *   - results come back through trailing pointer parameters;
 *   - no C++ exception ever crosses this boundary.
 *
 * model.so includes only this header: it reaches libtorch solely through the
 * AotpackHostV1 function table the runtime hands to aotpack_model_create(), so
 * generated code never includes ATen headers (compiles in well under a second).
 *
 * Versioning (DLPack style): two contracts, each with MAJOR and MINOR numbers packed as
 * (MAJOR << 16) | MINOR.
 *   Model ABI (AOTPACK_MODEL_ABI_VERSION): the functions model.so exports and their
 *     meaning. The runtime refuses a model.so (and a manifest model.abi_version, which
 *     records the MAJOR) of another MAJOR; a MINOR only adds optional exports.
 *   Host ABI (AOTPACK_HOST_ABI_VERSION): the AotpackHostV1 table the runtime hands to
 *     model.so. model.so refuses a table of another MAJOR or with a struct_size smaller
 *     than the table it was compiled against; a MINOR appends functions at the end of the
 *     table (announced through struct_size), so older model.so files keep working.
 *   MAJOR = incompatible layout or semantics change, refused on mismatch; MINOR =
 *     compatible additions. The kernel launch ABI (kernel.so, wrapper.so) is versioned
 *     separately in kernel_abi.h.
 */
#ifndef AOTPACK_MODEL_ABI_H
#define AOTPACK_MODEL_ABI_H

#include <stdint.h>

/* Marks exported symbols (the runtime library is built with -fvisibility=hidden). */
#ifndef AOTPACK_EXPORT
#if defined(__GNUC__)
#define AOTPACK_EXPORT __attribute__((visibility("default")))
#else
#define AOTPACK_EXPORT
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Model ABI: model.so exports (aotpack_model_abi_version() returns the packed value). */
#define AOTPACK_MODEL_ABI_VERSION_MAJOR 2
#define AOTPACK_MODEL_ABI_VERSION_MINOR 0
#define AOTPACK_MODEL_ABI_VERSION \
  ((AOTPACK_MODEL_ABI_VERSION_MAJOR << 16) | AOTPACK_MODEL_ABI_VERSION_MINOR)

/* Host ABI: the AotpackHostV1 table (its host_abi_version field holds the packed value). */
#define AOTPACK_HOST_ABI_VERSION_MAJOR 1
#define AOTPACK_HOST_ABI_VERSION_MINOR 1
#define AOTPACK_HOST_ABI_VERSION \
  ((AOTPACK_HOST_ABI_VERSION_MAJOR << 16) | AOTPACK_HOST_ABI_VERSION_MINOR)

/* Opaque tensor handle owned by the runtime (an at::Tensor* inside it).
 * Every handle a host function returns is a new reference: give it back with release(). */
typedef struct AotpackTensorOpaque* AotpackTensor;

/* dtype codes: c10::ScalarType numbering, so the runtime converts with a cast. */
enum AotpackDType {
  AOTPACK_DTYPE_UINT8 = 0,
  AOTPACK_DTYPE_INT8 = 1,
  AOTPACK_DTYPE_INT16 = 2,
  AOTPACK_DTYPE_INT32 = 3,
  AOTPACK_DTYPE_INT64 = 4,
  AOTPACK_DTYPE_FLOAT16 = 5,
  AOTPACK_DTYPE_FLOAT32 = 6,
  AOTPACK_DTYPE_FLOAT64 = 7,
  AOTPACK_DTYPE_BOOL = 11,
  AOTPACK_DTYPE_BFLOAT16 = 15
};

/* Kinds of extern-call argument, in the order of the ATen schema. */
enum AotpackArgKind {
  AOTPACK_ARG_NONE = 0,          /* None / nullopt                                  */
  AOTPACK_ARG_TENSOR = 1,        /* v.tensor (may be NULL for an absent Tensor?)    */
  AOTPACK_ARG_INT = 2,           /* v.i  (also SymInt, and Scalar given as int)     */
  AOTPACK_ARG_DOUBLE = 3,        /* v.d  (float, and Scalar given as float)         */
  AOTPACK_ARG_BOOL = 4,          /* v.i  (0 or 1)                                    */
  AOTPACK_ARG_INT_LIST = 5,      /* v.ints[len]                                      */
  AOTPACK_ARG_DOUBLE_LIST = 6,   /* v.doubles[len]                                   */
  AOTPACK_ARG_BOOL_LIST = 7,     /* v.ints[len], each 0 or 1                         */
  AOTPACK_ARG_TENSOR_LIST = 8,   /* v.tensors[len]; a NULL entry means None (Tensor?[]) */
  AOTPACK_ARG_STRING = 9,        /* v.str, NUL-terminated                            */
  AOTPACK_ARG_SCALAR_TYPE = 10,  /* v.i, an AotpackDType code                        */
  AOTPACK_ARG_LAYOUT = 11,       /* v.i, c10::Layout value (0 = strided)             */
  AOTPACK_ARG_DEVICE = 12,       /* v.str, e.g. "cpu"                                */
  AOTPACK_ARG_MEMORY_FORMAT = 13 /* v.i, c10::MemoryFormat value                     */
};

typedef struct AotpackArg {
  int32_t kind; /* an AotpackArgKind */
  int64_t len;  /* element count for the *_LIST kinds, else 0 */
  union {
    AotpackTensor tensor;
    int64_t i;
    double d;
    const int64_t* ints;
    const double* doubles;
    const AotpackTensor* tensors;
    const char* str;
  } v;
} AotpackArg;

/* Functions the runtime hands to model.so. All sizes and strides are in elements. */
typedef struct AotpackHostV1 {
  uint32_t host_abi_version; /* AOTPACK_HOST_ABI_VERSION of the runtime */
  uint32_t struct_size;      /* sizeof(AotpackHostV1) as the runtime compiled it */

  /* Resolve an ATen operator once ("aten::addmm", overload "" for default).
   * Writes an opaque handle valid for the runtime's lifetime. */
  int32_t (*find_op)(const char* name, const char* overload, void** op_out);
  /* Call a resolved operator with its schema arguments in schema order (defaults
   * filled in; trailing arguments that have a schema default may be left out).
   * Tensor results are flattened in order (a Tensor[] result contributes each
   * element); exactly num_outs handles are written, NULL for a None result. */
  int32_t (*call_op)(void* op, const AotpackArg* args, int64_t num_args,
                     AotpackTensor* outs, int64_t num_outs);
  /* New uninitialised CPU tensor. */
  int32_t (*empty_strided)(int64_t ndim, const int64_t* sizes, const int64_t* strides,
                           int32_t dtype, AotpackTensor* out);
  /* New view of base: element offset is relative to base's first element. */
  int32_t (*as_strided)(AotpackTensor base, int64_t ndim, const int64_t* sizes,
                        const int64_t* strides, int64_t offset, AotpackTensor* out);
  /* Address of the tensor's first element (storage offset applied). */
  int32_t (*data_ptr)(AotpackTensor t, void** out);
  /* 0 when t has exactly this dtype, shape and strides (a stride is ignored where
   * the size is 1); else non-zero with a message naming the first difference. */
  int32_t (*check_layout)(AotpackTensor t, int64_t ndim, const int64_t* sizes,
                          const int64_t* strides, int32_t dtype);
  /* dst.copy_(src) with broadcasting and dtype conversion. */
  int32_t (*copy_)(AotpackTensor dst, AotpackTensor src);
  /* Drop one reference. NULL is ignored. */
  void (*release)(AotpackTensor t);
  /* Message of the last failed host call on this thread. */
  const char* (*last_error)(void);

  /* ---- host ABI 1.1 ---- */
  /* Typed (unboxed) dispatcher calls of the GEMM/convolution ops aotpack tunes:
   * aten::addmm, aten::mm, aten::bmm, aten::convolution, mkl::_mkl_linear,
   * mkldnn::_linear_pointwise (and .binary), mkldnn::_convolution_pointwise.
   * find_typed resolves and signature-checks the op once (fails for other ops);
   * call_typed takes every schema argument in order (the call_op encoding; a
   * Scalar?[] as an int or double list) and writes its one result, a new reference. */
  int32_t (*find_typed)(const char* name, const char* overload, void** op_out);
  int32_t (*call_typed)(void* op, const AotpackArg* args, int64_t num_args, AotpackTensor* out);
} AotpackHostV1;

/* ---- exported by every model.so (names are part of the ABI) ---- */

/* Returns AOTPACK_MODEL_ABI_VERSION ((MAJOR << 16) | MINOR) the model was generated for. */
typedef int32_t (*aotpack_model_abi_version_fn)(void);

/* Build a model instance.
 *   root_dir:     folder the archive was extracted to (kernel paths are relative to it)
 *   constants:    weights/buffers in manifest "constants" order; borrowed, they must
 *                 outlive the instance (mutated buffers are written in place)
 *   device_limit: cores the kernels may use; 0 = the limit recorded at build time  */
typedef int32_t (*aotpack_model_create_fn)(const AotpackHostV1* host, const char* root_dir,
                                           const AotpackTensor* constants,
                                           int64_t num_constants, int32_t device_limit,
                                           void** model_out);

/* Run once. inputs are borrowed; each outputs[i] receives a new reference. */
typedef int32_t (*aotpack_model_run_fn)(void* model, const AotpackTensor* inputs,
                                        int64_t num_inputs, AotpackTensor* outputs,
                                        int64_t num_outputs);

typedef void (*aotpack_model_destroy_fn)(void* model);
typedef const char* (*aotpack_model_last_error_fn)(void);

/* The per-kernel wrapper.so and static kernel.so entry points, and the launch struct
 * model.so passes them, are defined in kernel_abi.h (kernel launch ABI). */

#ifdef __cplusplus
}
#endif

#endif /* AOTPACK_MODEL_ABI_H */
