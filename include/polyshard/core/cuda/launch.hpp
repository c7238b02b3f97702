// Kernel launches, one spelling for both builds of the kernel sources: `<<<grid, block, shared,
// stream>>>` when nvcc compiles them for a GPU, the emulated device's launcher when the host
// compiler compiles them for the CPU (POLYSHARD_CUDA_EMULATION, see docs/cuda.md). Device code
// only: include from .cu files (device_math.cuh does).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "polyshard/core/cuda/error.hpp"

#if defined(POLYSHARD_CUDA_EMULATION)
#include "polyshard/emulation/device.hpp"
#else
/// `POLYSHARD_SHARED(type, name, [dims]);`: a block's static shared memory, `__shared__ type
/// name[dims]`. Spelled so that the emulated device can poison it at every block's start
/// (emulation/device.hpp); kernels use it rather than a bare __shared__ (a test checks).
#define POLYSHARD_SHARED(type, name, ...) __shared__ type name __VA_ARGS__
/// `POLYSHARD_DYNAMIC_SHARED(type, name);`: the block's dynamic shared memory (the launch's
/// shared-bytes argument) as `type* const name`, 16-byte aligned. Every kernel names the same
/// extern array of bytes: extern __shared__ arrays of different types may not share a name.
#define POLYSHARD_DYNAMIC_SHARED(type, name)                                   \
  extern __shared__ __align__(16) unsigned char polyshard_dynamic_shared[]; \
  type* const name = reinterpret_cast<type*>(polyshard_dynamic_shared)
#endif

namespace polyshard::cuda {

/// Launches `Kernel` on `stream` with `grid` x `block` threads and `shared_bytes` of dynamic
/// shared memory; the arguments convert to the kernel's parameters as they do through `<<<>>>`.
/// Check the launch afterwards with POLYSHARD_CUDA_CHECK_LAUNCH, as after `<<<>>>`.
template <auto Kernel, class... Args>
inline void launch(dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream, Args&&... args) {
#if defined(POLYSHARD_CUDA_EMULATION)
  emulation::launch<Kernel>(grid, block, shared_bytes, stream, std::forward<Args>(args)...);
#else
  // clang-format off (the launch is nvcc's syntax, which clang-format splits)
  Kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  // clang-format on
#endif
}

/// Lets `Kernel` take `bytes` of dynamic shared memory on the current device: a launch with more
/// than 48 KiB fails unless the kernel's limit was raised first (to at most 227 KiB on sm_90).
/// The limit belongs to the device as well as the kernel, so launchers call this before each
/// launch that needs it (a driver call of a few microseconds) rather than once.
template <auto Kernel>
inline void allow_dynamic_shared(std::size_t bytes) {
  if (bytes > 48 * 1024)
    POLYSHARD_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(Kernel),
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace polyshard::cuda
