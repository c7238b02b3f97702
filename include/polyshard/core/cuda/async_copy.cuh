// Copies from global to shared memory that run while the thread goes on computing (PTX's
// cp.async, sm_80 and later), for kernel sources (device code only): a kernel starts the next
// tile's copy, computes on the current one, and waits for the copy only when it needs the tile.
//
//   copy_async<16>(shared_dst, global_src, live);  // live false: dst becomes zeros
//   copy_async_commit();                            // what was started since is one group
//   copy_async_wait<1>();                           // all but the newest group have landed
//   __syncthreads();                                // and are visible to the whole block
//
// A copy is this thread's alone: other threads see it only after this thread's wait and a
// barrier. On the emulated device (POLYSHARD_CUDA_EMULATION) a copy lands at the wait that covers
// it, not before, so that a kernel reading a tile it has not waited for reads stale data there
// as it could on a GPU.
#pragma once

#include <cstdint>

#include "polyshard/core/cuda/device_math.cuh"  // the emulated device's built-ins

namespace polyshard::cuda {

/// Starts copying BYTES (4, 8 or 16; dst and src aligned to it) from global `src` to shared
/// `dst`, or zeros to dst where `live` is false (src is then not read, but must still be a
/// valid address: the tensor's base, say).
template <int BYTES>
__device__ __forceinline__ void copy_async(void* dst, const void* src, bool live) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(POLYSHARD_CUDA_EMULATION)
  ::polyshard::emulation::async_copy(dst, live ? src : nullptr, BYTES);
#else
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int source_bytes = live ? BYTES : 0;  // the rest of the BYTES are zero-filled
  if constexpr (BYTES == 16) {
    // .cg: through L2 only; the tiles are read once per block.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src), "r"(source_bytes));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(address), "l"(src), "n"(BYTES),
                 "r"(source_bytes));
  }
#endif
}

/// The copies this thread started since its last commit become one group.
__device__ __forceinline__ void copy_async_commit() {
#if defined(POLYSHARD_CUDA_EMULATION)
  ::polyshard::emulation::async_copy_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

/// Waits until at most PENDING of this thread's newest committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void copy_async_wait() {
#if defined(POLYSHARD_CUDA_EMULATION)
  ::polyshard::emulation::async_copy_wait(PENDING);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
#endif
}

}  // namespace polyshard::cuda
