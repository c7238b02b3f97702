// Reads of device memory for initcheck (emulation/initcheck.hpp) to judge; the initcheck build
// runs each and expects its verdict. argv[1]:
// - "unwritten": a kernel reads the last element of a buffer whose other elements a copy wrote;
// - "pack": a kernel loads 16 bytes of which only the first 8 were written (the value it keeps
//   comes from the written half alone: the poison cannot show in any result);
// - "written": the same reads after every byte was written, by a copy, a set and a kernel;
// - "freed": a buffer freed and allocated again is unwritten again.
#ifndef POLYSHARD_CUDA_EMULATION
#define POLYSHARD_CUDA_EMULATION
#endif
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "polyshard/emulation/device.hpp"
#include "polyshard/emulation/initcheck.hpp"

namespace {

__global__ void sum_kernel(const float* in, int n, float* out) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += in[i];
  *out = s;
}

struct alignas(16) Pack {
  float x[4];
};

__global__ void first_of_pack_kernel(const Pack* in, float* out) {
  const Pack p = in[threadIdx.x];  // 16 bytes
  out[threadIdx.x] = p.x[0] + p.x[1];
}

__global__ void fill_kernel(float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = 1.0f;
}

}  // namespace

int main(int argc, char** argv) {
  namespace emu = polyshard::emulation;
  const std::string which = argc > 1 ? argv[1] : "";
  if (!emu::initcheck::enabled()) {
    std::fprintf(stderr, "this program must link the initcheck build of the emulated device\n");
    return 2;
  }
  constexpr int n = 64;
  float* d = nullptr;
  float* out = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&d), (n + 1) * sizeof(float)) != cudaSuccess) return 2;
  if (cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(float)) != cudaSuccess) return 2;
  const std::vector<float> ones(n + 1, 1.0f);
  if (which == "unwritten") {
    cudaMemcpy(d, ones.data(), n * sizeof(float), cudaMemcpyHostToDevice);  // all but the last
    emu::launch<sum_kernel>(dim3(1), dim3(1), 0, nullptr, d, n + 1, out);
  } else if (which == "pack") {
    cudaMemcpy(d, ones.data(), 2 * sizeof(float), cudaMemcpyHostToDevice);  // the pack's first half
    emu::launch<first_of_pack_kernel>(dim3(1), dim3(1), 0, nullptr, reinterpret_cast<const Pack*>(d), out);
  } else if (which == "written") {
    cudaMemcpy(d, ones.data(), 16 * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemset(d + 16, 0, 16 * sizeof(float));
    emu::launch<fill_kernel>(dim3(1), dim3(1), 0, nullptr, d + 32, n + 1 - 32);
    emu::launch<sum_kernel>(dim3(1), dim3(1), 0, nullptr, d, n + 1, out);
    emu::launch<first_of_pack_kernel>(dim3(1), dim3(4), 0, nullptr, reinterpret_cast<const Pack*>(d), out);
  } else if (which == "freed") {
    cudaMemset(d, 0, (n + 1) * sizeof(float));
    cudaFree(d);
    if (cudaMalloc(reinterpret_cast<void**>(&d), (n + 1) * sizeof(float)) != cudaSuccess) return 2;
    if (emu::initcheck::unwritten_bytes(d, (n + 1) * sizeof(float)) != (n + 1) * sizeof(float)) {
      std::fprintf(stderr, "a buffer allocated again is not unwritten again\n");
      return 1;
    }
    emu::launch<sum_kernel>(dim3(1), dim3(1), 0, nullptr, d, n, out);
  } else {
    std::fprintf(stderr, "usage: %s unwritten|pack|written|freed\n", argv[0]);
    return 2;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  std::printf("no unwritten read was reported\n");
  return 0;
}
