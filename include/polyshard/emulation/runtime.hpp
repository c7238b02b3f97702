// The emulated CUDA device's runtime, as its parts see one another: the kernel launcher
// (device.hpp), cuBLASLt (cublaslt.cpp) and NCCL (nccl.cpp) enqueue their work on emulated
// streams and report faults through these functions. A program sees only the CUDA runtime API
// (cuda_runtime_api.h), which runtime.cpp implements over them.
//
// The model: every emulated device has its own memory (cudaMalloc on device d gives memory of d
// only), its streams each run their queue in order on a worker thread of their own, events
// order work across streams, and a fault inside enqueued work (a kernel whose threads do not all
// reach a barrier, say) becomes the device's sticky error, returned by the next synchronising
// call, as on a GPU. The environment variable POLYSHARD_EMULATION_SYNC=1 runs every piece of
// work when it is enqueued (for debugging); POLYSHARD_EMULATION_DEVICES=N sets the device count
// (default 4).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>

namespace polyshard::emulation {

/// Work for a stream: runs on the stream's worker, in order with the stream's other work. It may
/// throw DeviceFault (or any std::exception): the device's sticky error becomes `code` and the
/// message is kept for last_fault_message().
using Work = std::function<void()>;

/// A fault found while enqueued work runs, as a GPU would report it at the next synchronisation.
struct DeviceFault {
  cudaError_t code = cudaErrorLaunchFailure;
  std::string message;  // names the kernel (or library call) and what went wrong
};

/// The device this host thread works on (cudaSetDevice / cudaGetDevice).
int current_device();

/// The dynamic shared memory `kernel` may take when launched on the current device: 48 KiB, or
/// what cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) set
/// there. A GPU keeps the attribute per function and device, and so does the emulation.
std::size_t dynamic_shared_limit(const void* kernel);

/// The device a stream belongs to (the legacy default stream 0 is the current device's).
int stream_device(cudaStream_t stream);

/// Appends `work` to `stream`'s queue (0 / cudaStreamLegacy: the current device's default
/// stream, with the legacy stream's implicit ordering against blocking streams). `what` names it
/// in fault messages ("kernel softmax_forward_kernel<float>", "cublasLtMatmul", "ncclAllReduce").
/// In synchronous mode the work runs before enqueue returns.
void enqueue(cudaStream_t stream, std::string what, Work work);

/// Makes the next cudaGetLastError / cudaPeekAtLastError return `code` (a launch that is refused
/// before it runs: a bad configuration, an argument from another device's memory), and keeps
/// `message` for last_fault_message(). Also prints the message to stderr, prefixed
/// "polyshard emulated CUDA: ".
void report_launch_error(cudaError_t code, std::string message);

/// The message of the last fault or refused launch on this process (empty if none): tests check
/// that a fault names its kernel.
std::string last_fault_message();

/// What a pointer points into.
enum class MemoryKind { device, pinned_host, unknown };
struct PointerInfo {
  MemoryKind kind = MemoryKind::unknown;
  int device = -1;             // for device memory: its device
  const void* base = nullptr;  // the allocation's first byte
  std::size_t size = 0;        // the allocation's size in bytes
};
/// Looks `p` up among the live allocations (device memory of every device, cudaHostAlloc'd memory).
PointerInfo find_pointer(const void* p);

/// Whether every stream runs its work at enqueue (POLYSHARD_EMULATION_SYNC=1).
bool synchronous_mode();

}  // namespace polyshard::emulation
