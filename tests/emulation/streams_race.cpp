// Two streams of the emulated device touching one buffer, for ThreadSanitizer to judge (the
// emulated-tsan build runs this and expects its verdicts): a kernel on stream `a` writes the
// buffer, and stream `b` copies it to the host.
//   argv[1] "unordered": nothing orders the copy after the kernel. On a GPU the copy may read the
//     buffer half-written; here the two streams' threads race, and TSan must report it. The
//     kernel holds its writes until the copy is done, told by a relaxed atomic flag, which gives
//     TSan no ordering: the copy's reads come first and the kernel's writes after them in every
//     run, so no order the emulator's own locks happen to give the two threads hides the race.
//     (Left to the scheduler, a kernel that finished before the copy was enqueued was ordered
//     before it through those locks, and about one run in forty reported nothing.)
//   argv[1] "ordered": `b` waits on an event recorded on `a` after the kernel, so the copy sees
//     every element written, and TSan must report nothing.
// What this proves: a grid's accesses reach TSan as its stream thread's (grid.cpp), so a missing
// event between streams, the mistake the engine's streams could make, is found.
#ifndef POLYSHARD_CUDA_EMULATION
#define POLYSHARD_CUDA_EMULATION
#endif
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "polyshard/emulation/device.hpp"

namespace {

/// One emulated thread: waits until `go` is set, then writes every element. Relaxed: the flag
/// orders nothing for TSan.
__global__ void fill_kernel(int* out, int n, const std::atomic<int>* go) {
  while (go->load(std::memory_order_relaxed) == 0) std::this_thread::yield();
  for (int i = 0; i < n; ++i) out[i] = 3 * i + 1;
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  if (which != "unordered" && which != "ordered") {
    std::fprintf(stderr, "usage: %s unordered|ordered\n", argv[0]);
    return 2;
  }
  constexpr int n = 4096;
  int* d = nullptr;
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t written = nullptr;
  if (!ok(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(int)), "cudaMalloc") ||
      !ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !ok(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), "cudaEventCreate"))
    return 2;
  std::vector<int> host(n, -1);
  // Ordered, the copy waits for the kernel, which must not wait for the copy.
  std::atomic<int> go{which == "ordered" ? 1 : 0};
  polyshard::emulation::launch<fill_kernel>(dim3(1), dim3(1), 0, a, d, n, &go);
  if (which == "ordered" &&
      (!ok(cudaEventRecord(written, a), "cudaEventRecord") || !ok(cudaStreamWaitEvent(b, written, 0), "cudaStreamWaitEvent")))
    return 2;
  if (!ok(cudaMemcpyAsync(host.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, b), "cudaMemcpyAsync") ||
      !ok(cudaStreamSynchronize(b), "cudaStreamSynchronize"))
    return 2;
  go.store(1, std::memory_order_relaxed);  // unordered: the kernel writes after the copy read
  if (!ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 2;
  if (which == "ordered") {
    for (int i = 0; i < n; ++i)
      if (host[static_cast<std::size_t>(i)] != 3 * i + 1) {
        std::fprintf(stderr, "element %d is %d after the ordered copy, not %d\n", i, host[static_cast<std::size_t>(i)],
                     3 * i + 1);
        return 1;
      }
  }
  std::printf("%s streams: the copy ended and no race was reported\n", which.c_str());
  return 0;
}
