// An out-of-bounds access inside a kernel on the emulated device, for AddressSanitizer to report
// (the emulated-sanitize build runs this and expects the report): argv[1] "device" writes one
// element past a cudaMalloc'd buffer, "local" one past a thread's local array after a barrier
// (its fiber was suspended and resumed in between). A GPU would corrupt memory silently.
#ifndef POLYSHARD_CUDA_EMULATION
#define POLYSHARD_CUDA_EMULATION
#endif
#include <cstdio>
#include <string>

#include "polyshard/emulation/device.hpp"

namespace {

__global__ void write_one_past_kernel(int* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);  // the grid has n + 1 threads
  if (i <= n) out[i] = i;
}

volatile int past_the_end = 8;  // unknown to the compiler

__attribute__((noinline)) int local_overflow(unsigned t) {
  int local[8];
  for (int i = 0; i < 8; ++i) local[i] = static_cast<int>(t) + i;
  __syncthreads();
  int* volatile p = local;  // hidden from the compiler: UBSan's bounds checks would stop it before ASan
  if (t == 37) p[past_the_end] = 1;
  return local[t % 8];
}

__global__ void local_overflow_kernel(int* out) { out[threadIdx.x] = local_overflow(threadIdx.x); }

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  constexpr int n = 256;
  int* d = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&d), (n + 64) * sizeof(int)) != cudaSuccess) return 2;
  int* inside = d + 64;  // n ints at the end of the allocation
  if (which == "device") {
    polyshard::emulation::launch<write_one_past_kernel>(dim3(2), dim3((n + 1 + 1) / 2), 0, nullptr, inside, n);
  } else if (which == "local") {
    polyshard::emulation::launch<local_overflow_kernel>(dim3(1), dim3(64), 0, nullptr, d);
  } else {
    std::fprintf(stderr, "usage: %s device|local\n", argv[0]);
    return 2;
  }
  cudaDeviceSynchronize();
  std::printf("no fault was reported\n");
  return 0;
}
