// Uses an installed polyshard's CUDA half: device tensors and their ops, from kernels this
// project compiled out of the installed .cu files.
#include <iostream>

#include <polyshard/core/cuda/runtime.hpp>
#include <polyshard/tensor/cuda/ops.hpp>
#include <polyshard/tensor/cuda/transfer.hpp>

using namespace polyshard;

int main() {
  const auto devices = cuda::available_devices();
  if (!devices) {
    std::cout << "cuda: no CUDA device (" << devices.reason << ")\n";
    return 0;
  }
  const auto x = to_device(Tensor<float>::from(Shape{2, 2}, {1.0f, -1.0f, 0.5f, 0.0f}));
  const auto y = to_host(matmul(x, x));  // [[0.5, -1], [0.5, -0.5]]
  std::cout << "cuda: matmul " << y.at(0, 0) << " " << y.at(0, 1) << " " << y.at(1, 0) << " " << y.at(1, 1) << "\n";
  return 0;
}
