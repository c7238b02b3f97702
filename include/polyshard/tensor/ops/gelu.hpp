// GELU, tanh approximation (GPT-2's): forward and backward kernels.
#pragma once

#include <numbers>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

namespace detail {
inline constexpr double gelu_k0 = 0.7978845608028654;  // sqrt(2 / pi)
inline constexpr double gelu_k1 = 0.044715;
}  // namespace detail

/// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise. x, y: one shape (any);
/// y contiguous.
template <FloatElement T>
void gelu_forward(const Tensor<T>& x, const Tensor<T>& y) {
  static_assert(detail::is_compute_float_v<T>, "gelu computes in float or double: cast half and bfloat16 tensors to float first");
  detail::check_output("gelu", "y", y, x.shape());
  const Tensor<T> xc = x.contiguous();
  const std::int64_t n = x.numel();
  const T k0 = T(detail::gelu_k0), k1 = T(detail::gelu_k1);
  auto xm = detail::array_map(xc.data(), n);
  // Eigen's tanh and the fused expression vectorize; std::tanh in a loop would not.
  detail::array_map(y.data(), n) = T(0.5) * xm * (T(1) + (k0 * (xm + k1 * xm.cube())).tanh());
}

/// dx (+)= dy * gelu'(x). x, dy, dx: one shape; the input x, not the output, is what is saved.
template <FloatElement T>
void gelu_backward(const Tensor<T>& x, const Tensor<T>& dy, const GradOut<T>& dx) {
  static_assert(detail::is_compute_float_v<T>, "gelu computes in float or double: cast half and bfloat16 tensors to float first");
  if (!dx.wanted()) return;
  check_same_shape("gelu backward", x.shape(), dy.shape());
  detail::check_output("gelu backward", "dx", dx.tensor, x.shape());
  const Tensor<T> xc = x.contiguous(), dyc = dy.contiguous();
  const std::int64_t n = x.numel();
  const T k0 = T(detail::gelu_k0), k1 = T(detail::gelu_k1);
  // Blocks small enough for the tanh values to stay in L1 between the two passes.
  constexpr std::int64_t block = 1024;
  alignas(64) T t_buf[block];
  for (std::int64_t s = 0; s < n; s += block) {
    const std::int64_t m = std::min(block, n - s);
    auto xm = detail::array_map(xc.data() + s, m);
    auto t = detail::array_map(t_buf, m);
    t = (k0 * (xm + k1 * xm.cube())).tanh();
    // d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) k0 (1 + 3 k1 x^2)
    auto grad = detail::array_map(dyc.data() + s, m) *
                (T(0.5) * (T(1) + t) + T(0.5) * xm * (T(1) - t.square()) * k0 * (T(1) + T(3) * k1 * xm.square()));
    detail::assign_or_add(detail::array_map(dx.tensor.data() + s, m), grad, dx.accumulate);
  }
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_GELU_INSTANCES(EXTERN, T) \
  EXTERN template void gelu_forward<T>(const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void gelu_backward<T>(const Tensor<T>&, const Tensor<T>&, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_GELU_INSTANCES)

}  // namespace polyshard
