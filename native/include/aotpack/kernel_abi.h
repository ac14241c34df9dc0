/* aotpack kernel launch ABI: how a static kernel.so and a per-kernel wrapper.so are called.
 *
 * Three parties, each its own shared object:
 *   kernel.so   one compiled tiling of one fused kernel (static_kernel/<kernel_key>/);
 *   wrapper.so  the kernel_key -> TilingInfo table of a fused kernel; loads the kernel.so
 *               files, checks their kernel ABI, validates launches and forwards them;
 *   caller      the generated model.so at run time, or aotpack's Python launcher during
 *               autotuning (aotpack/backends/cpu/launch_abi.py).
 *
 * Who allocates what: the CALLER owns every buffer. It asks the wrapper for the kernel's
 * TilingInfo (aotpack_tiling_info), allocates `workspace_bytes` of scratch memory once per
 * kernel at load (64-byte aligned, AOTPACK_WORKSPACE_ALIGNMENT), and passes it with every
 * launch; it also allocates the kernel's inputs and outputs (args). Kernels and wrappers
 * never allocate per launch, and never keep a pointer after the launch returns.
 *
 * Versioning (DLPack style). AOTPACK_KERNEL_ABI_VERSION packs MAJOR << 16 | MINOR:
 *   MAJOR  bumped on an incompatible change: a field moved, removed or re-typed, an entry
 *          point's signature or meaning changed. A reader refuses another MAJOR.
 *   MINOR  bumped on a compatible addition: a field appended to a struct (announced by
 *          struct_size), a new status or device code, a new optional entry point. A reader
 *          accepts any MINOR of its MAJOR: it reads only the fields the caller's struct_size
 *          covers and treats missing ones as their documented default.
 * The wrapper refuses a kernel.so of another MAJOR; model.so refuses a wrapper.so of another
 * MAJOR. The model ABI (model.so <-> runtime) and the host ABI (AotpackHostV1) have their own
 * version numbers in model_abi.h.
 *
 * Generated kernels and wrappers are compiled without any -I flag, so they do not include
 * this header: they inline the same declarations from templates/kernel_abi.h.j2 (a copy
 * without these comments). tests/unit/test_kernel_abi.py checks that both declare the same code.
 * Change both together.
 */
#ifndef AOTPACK_KERNEL_ABI_H
#define AOTPACK_KERNEL_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** \brief Kernel ABI MAJOR: incompatible layout or semantics change; refused on mismatch. */
#define AOTPACK_KERNEL_ABI_VERSION_MAJOR 1
/** \brief Kernel ABI MINOR: compatible additions (appended fields, new codes). */
#define AOTPACK_KERNEL_ABI_VERSION_MINOR 0
/** \brief (MAJOR << 16) | MINOR, as returned by aotpack_kernel_abi_version(). */
#define AOTPACK_KERNEL_ABI_VERSION \
  ((AOTPACK_KERNEL_ABI_VERSION_MAJOR << 16) | AOTPACK_KERNEL_ABI_VERSION_MINOR)
/** \brief Alignment in bytes the caller gives a workspace (a cache line, AVX-512 loads). */
#define AOTPACK_WORKSPACE_ALIGNMENT 64

/** \brief Device the launch targets: DLPack DLDeviceType codes (same numbers). */
enum AotpackDeviceType {
  AOTPACK_DEVICE_CPU = 1,      /**< \brief kDLCPU: host memory, stream NULL */
  AOTPACK_DEVICE_CUDA = 2,     /**< \brief kDLCUDA */
  AOTPACK_DEVICE_ROCM = 10,    /**< \brief kDLROCM */
  AOTPACK_DEVICE_EXT_DEV = 12  /**< \brief kDLExtDev: vendor accelerators (e.g. an NPU) */
};

/** \brief Status of aotpack_kernel_launch(): 0 = ok, anything else = nothing was computed. */
enum AotpackKernelStatus {
  AOTPACK_KERNEL_OK = 0,              /**< \brief the kernel ran */
  AOTPACK_KERNEL_ERR_STRUCT_SIZE = 1, /**< \brief launch is NULL or struct_size too small */
  AOTPACK_KERNEL_ERR_DEVICE = 2,      /**< \brief device_type/device_id not served here */
  AOTPACK_KERNEL_ERR_WORKSPACE = 3,   /**< \brief workspace NULL or below the declared bytes */
  AOTPACK_KERNEL_ERR_THREADS = 4,     /**< \brief max_threads < 0 */
  AOTPACK_KERNEL_ERR_ARGS = 5         /**< \brief args is NULL */
};

/** \brief One launch of a kernel (ABI 1.0 layout: sizeof 48 on LP64, natural alignment). */
typedef struct AotpackKernelLaunch {
  /** \brief sizeof(AotpackKernelLaunch) as the caller compiled it; fields past it are
   *  absent (treated as their default). Must be >= AOTPACK_KERNEL_LAUNCH_V1_SIZE. */
  uint32_t struct_size;
  /** \brief An AotpackDeviceType (DLPack code); CPU kernels accept only AOTPACK_DEVICE_CPU. */
  int32_t device_type;
  /** \brief Device ordinal (DLPack device_id); 0 on CPU. */
  int32_t device_id;
  /** \brief Queue the kernel is enqueued on (cudaStream_t, aclrtStream, ...); NULL on CPU,
   *  where the launch is synchronous. */
  void* stream;
  /** \brief Scratch memory of at least the TilingInfo's workspace_bytes, aligned to
   *  AOTPACK_WORKSPACE_ALIGNMENT, owned by the caller; may be NULL when that is 0. Its
   *  contents on entry are unspecified and it is not preserved between launches. */
  void* workspace;
  /** \brief Size of `workspace` in bytes. */
  uint64_t workspace_bytes;
  /** \brief Cap on the threads (CPU) or cores the kernel may use: 0 = the tiling's own
   *  block_dim, n > 0 = min(n, block_dim). The runtime passes its device limit here; a
   *  wrapper lowers it to the launched candidate's block_dim (candidates that differ only
   *  in block_dim share one binary, rendered for the most threads). */
  int32_t max_threads;
} AotpackKernelLaunch;

/** \brief struct_size of the 1.0 AotpackKernelLaunch (through max_threads): the least a
 *  reader accepts. Stays fixed when fields are appended. */
#define AOTPACK_KERNEL_LAUNCH_V1_SIZE \
  ((uint32_t)(offsetof(AotpackKernelLaunch, max_threads) + sizeof(int32_t)))

/** \brief What a wrapper.so knows about one kernel_key (the solver's triple). */
typedef struct AotpackTilingInfo {
  /** \brief Set by the caller: sizeof(AotpackTilingInfo) as it compiled it; the wrapper
   *  fills only the fields this covers. */
  uint32_t struct_size;
  /** \brief Threads/cores the tiling was generated for (its parallel width). */
  int32_t block_dim;
  /** \brief Scratch bytes each launch needs (0 = none); the caller allocates them. */
  uint64_t workspace_bytes;
  /** \brief The tiling's canonical text, NUL-terminated; static storage of wrapper.so. */
  const char* tiling_repr;
} AotpackTilingInfo;

/* ---- exported by every static kernel.so ----
 *
 * int32_t aotpack_kernel_abi_version(void);
 *     AOTPACK_KERNEL_ABI_VERSION the kernel was generated for.
 * int32_t aotpack_kernel_launch(const AotpackKernelLaunch* launch, void* const* args);
 *     Runs the kernel once, synchronously on CPU. args: data pointers of the inputs, then
 *     the outputs, in the kernel's argument order, laid out exactly as generated.
 *     Returns an AotpackKernelStatus.
 *
 * ---- exported by every per-kernel wrapper.so ----
 * Every entry point returns int32_t: 0 (or a count) = ok, negative = error with the
 * message in aotpack_last_error() (thread-local, valid until the next call).
 *
 * int32_t aotpack_kernel_abi_version(void);
 *     AOTPACK_KERNEL_ABI_VERSION the wrapper implements.
 * int32_t aotpack_init(const char* kernel_dir);
 *     dlopen static_kernel/<kernel_key>/kernel.so under kernel_dir for each kernel_key
 *     present; refuses one of another kernel ABI MAJOR. Returns the count loaded (>= 1).
 * int32_t aotpack_tiling_info(const char* kernel_key, AotpackTilingInfo* info);
 *     The TilingInfo of kernel_key (loaded or not); the caller sets info->struct_size.
 * int32_t aotpack_launch(const char* kernel_key, const AotpackKernelLaunch* launch,
 *                        void* const* args);
 *     Checks the launch against the TilingInfo (workspace_bytes, struct_size) and runs it.
 * int32_t aotpack_release(const char* keep_kernel_key);
 *     Unloads every kernel.so but keep_kernel_key.
 * const char* aotpack_last_error(void);
 */
typedef int32_t (*aotpack_kernel_abi_version_fn)(void);
typedef int32_t (*aotpack_kernel_launch_fn)(const AotpackKernelLaunch* launch, void* const* args);
typedef int32_t (*aotpack_wrapper_init_fn)(const char* kernel_dir);
typedef int32_t (*aotpack_tiling_info_fn)(const char* kernel_key, AotpackTilingInfo* info);
typedef int32_t (*aotpack_wrapper_launch_fn)(const char* kernel_key, const AotpackKernelLaunch* launch,
                                             void* const* args);
typedef int32_t (*aotpack_wrapper_release_fn)(const char* keep_kernel_key);
typedef const char* (*aotpack_wrapper_last_error_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* AOTPACK_KERNEL_ABI_H */
