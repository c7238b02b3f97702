// The CUDA execution model on the CPU: a grid of blocks, the threads of a block as fibers
// (Boost.Context) on the calling thread, so that __syncthreads() is a real barrier and warp
// intrinsics exchange values between the lanes of a warp. Blocks run one after another.
//
// Faults a GPU would turn into a hang or garbage are reported instead: a barrier that not every
// thread of the block reaches, a warp intrinsic whose mask names a lane that does not take part.
// They throw DeviceFault naming the kernel, the block and the threads.
#pragma once

#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace polyshard::emulation {

/// A kernel launch's configuration.
struct LaunchShape {
  dim3 grid;
  dim3 block;
  std::size_t dynamic_shared_bytes = 0;
  /// The most the kernel may take: 48 KiB unless cudaFuncSetAttribute raised it (runtime.hpp's
  /// dynamic_shared_limit).
  std::size_t dynamic_shared_limit = 48 * 1024;
};

/// The launch limits a Hopper GPU checks (block size, grid extents, shared memory); empty when
/// the shape is valid, else the reason, as "block (2048, 1, 1) has 2048 threads; at most 1024".
std::string check_launch_shape(const LaunchShape& shape);

/// Runs `thread_body` once for every thread of every block of `shape`, with threadIdx, blockIdx,
/// blockDim and gridDim set for each; returns when the grid is done. `kernel` names the kernel in
/// fault messages. Throws DeviceFault (runtime.hpp) on a barrier or warp fault.
void run_grid(std::string_view kernel, const LaunchShape& shape, const std::function<void()>& thread_body);

// Called from inside thread_body (device code): the built-in variables and the intrinsics that
// need the other threads. Outside a running grid they throw.
const uint3& thread_index();
const uint3& block_index();
const dim3& block_dim();
const dim3& grid_dim();
/// The block's dynamic shared memory (extern __shared__), dynamic_shared_bytes long, 16-aligned.
void* dynamic_shared_memory();
/// Fills a static __shared__ object (POLYSHARD_SHARED) with 0xFF bytes the first time a thread
/// of the running block reaches its declaration: a GPU's shared memory starts as garbage, and
/// the emulation's object would otherwise keep the previous block's values.
void poison_static_shared(void* object, std::size_t bytes);
/// The calling thread's lane in its warp (%laneid): its linear index in the block modulo 32.
unsigned lane_id();
/// "kernel K: thread (x,y,z) of block (x,y,z)" for the grid thread running on the calling OS
/// thread; empty outside a kernel. Reports name where they were made with it.
std::string running_thread();

/// cp.async: the calling thread starts a copy of `bytes` from global memory at `src` (or of
/// zeros, where src is null) to shared memory at `dst`. It lands when a later
/// async_copy_wait(n) leaves at most n of the thread's committed groups pending, and not before:
/// the latest a GPU may, so that a read of dst that no wait covers sees the old bytes here too.
void async_copy(void* dst, const void* src, std::size_t bytes);
/// cp.async.commit_group: the copies started since the last commit become one group (possibly
/// empty).
void async_copy_commit();
/// cp.async.wait_group n: lands the calling thread's oldest committed groups until at most n
/// remain pending.
void async_copy_wait(int pending);

/// __syncthreads(): waits until every thread of the block has reached it.
void sync_threads();
/// __syncwarp(mask).
void sync_warp(unsigned mask);

/// The lanes of the calling warp named in `mask` each contribute `value` (up to 8 bytes); each
/// gets back what lane `source_lane` contributed; a source lane outside [0, 32) or not named in
/// `mask` gives back the caller's own value. The building block of the shuffles.
std::uint64_t exchange_in_warp(unsigned mask, std::uint64_t value, int source_lane);
/// __ballot_sync: the bits of the lanes in `mask` whose predicate is true.
unsigned ballot_in_warp(unsigned mask, bool predicate);

/// The fiber stacks the calling OS thread keeps for its grids' threads (one per thread of the
/// largest block it has run). Tests use it to check that stacks are reused, not leaked.
std::size_t pooled_fiber_stacks();

}  // namespace polyshard::emulation
