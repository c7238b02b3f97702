// SiLU (swish, torch.nn.SiLU), the gate of SwiGLU feed-forward layers: forward and backward kernels.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

/// y = x sigmoid(x) = x / (1 + exp(-x)), elementwise. x, y: one shape (any); y contiguous.
template <FloatElement T>
void silu_forward(const Tensor<T>& x, const Tensor<T>& y) {
  static_assert(detail::is_compute_float_v<T>, "silu computes in float or double: cast half and bfloat16 tensors to float first");
  detail::check_output("silu", "y", y, x.shape());
  const Tensor<T> xc = x.contiguous();
  const std::int64_t n = x.numel();
  auto xm = detail::array_map(xc.data(), n);
  // exp(-x) overflows to infinity for x below about -88 (float): y is then -0, its limit.
  detail::array_map(y.data(), n) = xm / (T(1) + (-xm).exp());
}

/// dx (+)= dy * silu'(x), silu'(x) = s (1 + x (1 - s)) with s = sigmoid(x). x, dy, dx: one
/// shape; the input x is what is saved.
template <FloatElement T>
void silu_backward(const Tensor<T>& x, const Tensor<T>& dy, const GradOut<T>& dx) {
  static_assert(detail::is_compute_float_v<T>, "silu computes in float or double: cast half and bfloat16 tensors to float first");
  if (!dx.wanted()) return;
  check_same_shape("silu backward", x.shape(), dy.shape());
  detail::check_output("silu backward", "dx", dx.tensor, x.shape());
  const Tensor<T> xc = x.contiguous(), dyc = dy.contiguous();
  const std::int64_t n = x.numel();
  // Blocks small enough for the sigmoid values to stay in L1 between the two passes.
  constexpr std::int64_t block = 1024;
  alignas(64) T s_buf[block];
  for (std::int64_t b = 0; b < n; b += block) {
    const std::int64_t m = std::min(block, n - b);
    auto xm = detail::array_map(xc.data() + b, m);
    auto s = detail::array_map(s_buf, m);
    s = T(1) / (T(1) + (-xm).exp());
    auto grad = detail::array_map(dyc.data() + b, m) * (s * (T(1) + xm * (T(1) - s)));
    detail::assign_or_add(detail::array_map(dx.tensor.data() + b, m), grad, dx.accumulate);
  }
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_SILU_INSTANCES(EXTERN, T) \
  EXTERN template void silu_forward<T>(const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void silu_backward<T>(const Tensor<T>&, const Tensor<T>&, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_SILU_INSTANCES)

}  // namespace polyshard
