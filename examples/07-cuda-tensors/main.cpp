// Device tensors and their ops: a layer norm and a matrix product on the GPU, checked against
// the same ops on the host.
// Without a CUDA device it says so and stops (CTest reports it skipped).
#include <cmath>
#include <cstdio>
#include <vector>

#include "polyshard/core/cuda/runtime.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/transfer.hpp"
#include "polyshard/tensor/ops.hpp"

using namespace polyshard;

namespace {
Tensor<float> ramp(const Shape& shape, float step) {
  auto t = Tensor<float>::empty(shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = std::sin(step * float(i));
  return t;
}
double max_difference(const Tensor<float>& a, const Tensor<float>& b) {
  double d = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) d = std::max(d, double(std::abs(a.data()[i] - b.data()[i])));
  return d;
}
}  // namespace

int main() {
  const auto devices = cuda::available_devices();
  if (!devices) {
    std::printf("no CUDA device (%s): nothing to run\n", devices.reason.c_str());
    return 0;
  }
  std::printf("running on %s\n", cuda::device_description(0).c_str());
  const auto x = ramp(Shape{8, 64, 128}, 0.37f), w = ramp(Shape{128, 256}, 0.11f);
  const auto gamma = Tensor<float>::full(Shape{128}, 1.0f), beta = Tensor<float>::zeros(Shape{128});

  // [device-ops]
  // Host tensors go to the device once; every op then runs as a kernel on the thread's stream.
  const Tensor<float, Cuda> dx = to_device(x), dw = to_device(w);
  auto h = Tensor<float, Cuda>::empty(x.shape());
  auto mean = Tensor<float, Cuda>::empty(Shape{8, 64}), rstd = Tensor<float, Cuda>::empty(Shape{8, 64});
  layer_norm_forward(dx, to_device(gamma), to_device(beta), 1e-5, h, mean, rstd);  // (B, T, C)
  const Tensor<float, Cuda> logits = matmul(h, dw);                                // (B, T, V) via cuBLASLt
  // [device-ops]

  // The same on the host: the CPU ops are the device ops' twins.
  auto hh = Tensor<float>::empty(x.shape()), hm = Tensor<float>::empty(Shape{8, 64}), hr = Tensor<float>::empty(Shape{8, 64});
  layer_norm_forward(x, gamma, beta, 1e-5, hh, hm, hr);
  const auto want = matmul(hh, w);
  const double diff = max_difference(to_host(logits), want);
  std::printf("layer norm + matmul: largest difference from the host %.2e\n", diff);
  if (!(diff < 1e-3)) return 1;
  std::printf("every check passed\n");
  return 0;
}
