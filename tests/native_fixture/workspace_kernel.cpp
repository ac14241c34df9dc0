// Hand-written static kernel.so that declares a non-zero workspace (kernel launch ABI,
// native/include/aotpack/kernel_abi.h). Generated CPU kernels need none today; this one
// proves the caller's workspace path: it writes every byte of the workspace it receives
// and reports what it got.
//
//   args[0]: const int64_t seed[1]     args[1]: int64_t probe[4] =
//     {workspace_bytes, workspace address % 64, sum of the bytes it wrote and read back,
//      max_threads}
//
// Build: g++ -O2 -shared -fPIC -std=c++17 -I native/include workspace_kernel.cpp -o kernel.so
//   -DAOTPACK_FIXTURE_ABI_MAJOR=2  reports kernel ABI 2.0 (the wrapper must refuse it)
//   -DAOTPACK_FIXTURE_OLD_ABI      exports only the pre-ABI `aotpack_kernel` entry point
#include <cstdint>

#include "aotpack/kernel_abi.h"

#ifndef AOTPACK_FIXTURE_WORKSPACE_BYTES
#define AOTPACK_FIXTURE_WORKSPACE_BYTES 4096
#endif
#ifndef AOTPACK_FIXTURE_ABI_MAJOR
#define AOTPACK_FIXTURE_ABI_MAJOR AOTPACK_KERNEL_ABI_VERSION_MAJOR
#endif

extern "C" {

#ifdef AOTPACK_FIXTURE_OLD_ABI
__attribute__((visibility("default"))) void aotpack_kernel(void* const* args, void* workspace,
                                                           int32_t num_threads) {}
#else
__attribute__((visibility("default"))) int32_t aotpack_kernel_abi_version(void) {
  return (AOTPACK_FIXTURE_ABI_MAJOR << 16) | AOTPACK_KERNEL_ABI_VERSION_MINOR;
}

__attribute__((visibility("default"))) int32_t aotpack_kernel_launch(
    const AotpackKernelLaunch* launch, void* const* args) {
  constexpr uint64_t kWorkspaceBytes = AOTPACK_FIXTURE_WORKSPACE_BYTES;
  if (launch == nullptr || launch->struct_size < AOTPACK_KERNEL_LAUNCH_V1_SIZE)
    return AOTPACK_KERNEL_ERR_STRUCT_SIZE;
  if (launch->device_type != AOTPACK_DEVICE_CPU || launch->device_id != 0)
    return AOTPACK_KERNEL_ERR_DEVICE;
  if (launch->workspace == nullptr || launch->workspace_bytes < kWorkspaceBytes)
    return AOTPACK_KERNEL_ERR_WORKSPACE;
  if (launch->max_threads < 0) return AOTPACK_KERNEL_ERR_THREADS;
  if (args == nullptr) return AOTPACK_KERNEL_ERR_ARGS;
  const int64_t seed = *static_cast<const int64_t*>(args[0]);
  int64_t* probe = static_cast<int64_t*>(args[1]);
  auto* bytes = static_cast<volatile uint8_t*>(launch->workspace);
  for (uint64_t i = 0; i < kWorkspaceBytes; ++i) bytes[i] = static_cast<uint8_t>(seed + i);
  int64_t sum = 0;
  for (uint64_t i = 0; i < kWorkspaceBytes; ++i) sum += bytes[i];
  probe[0] = static_cast<int64_t>(launch->workspace_bytes);
  probe[1] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(launch->workspace) % 64);
  probe[2] = sum;
  probe[3] = launch->max_threads;
  return AOTPACK_KERNEL_OK;
}
#endif

}  // extern "C"
