// Softmax and log-softmax over the last dimension: forward and backward kernels.
#pragma once

#include <cmath>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

namespace detail {
template <class T>
void check_rows(const char* op, const Tensor<T>& x) {
  POLYSHARD_CHECK(x.rank() >= 1 && x.size(-1) > 0, op, ": needs a non-empty last dimension, got shape ", x.shape());
}
}  // namespace detail

/// y = exp(x - max) / sum(exp(x - max)) over each row of the last dimension (partial sums added in double).
/// x, y: (..., N); y contiguous and may alias x.
template <FloatElement T>
void softmax_forward(const Tensor<T>& x, const Tensor<T>& y) {
  static_assert(detail::is_compute_float_v<T>, "softmax computes in float or double: cast half and bfloat16 tensors to float first");
  detail::check_rows("softmax", x);
  detail::check_output("softmax", "y", y, x.shape());
  const Tensor<T> xc = x.contiguous();
  const std::int64_t n = x.size(-1), rows = x.shape().leading(1);
  for (std::int64_t r = 0; r < rows; ++r) {
    auto xr = detail::array_map(xc.data() + r * n, n);  // (N,)
    auto yr = detail::array_map(y.data() + r * n, n);   // (N,)
    const T m = xr.maxCoeff();
    detail::exp_shift_scale(xr.data(), m, T(1), yr.data(), n);
    yr *= T(1.0 / detail::sum(yr));
  }
}

/// dx (+)= y (dy - sum(dy y)) per row, from the forward output y. y, dy, dx: (..., N).
template <FloatElement T>
void softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, const GradOut<T>& dx) {
  static_assert(detail::is_compute_float_v<T>, "softmax computes in float or double: cast half and bfloat16 tensors to float first");
  if (!dx.wanted()) return;
  check_same_shape("softmax backward", y.shape(), dy.shape());
  detail::check_output("softmax backward", "dx", dx.tensor, y.shape());
  const Tensor<T> yc = y.contiguous(), dyc = dy.contiguous();
  const std::int64_t n = y.size(-1), rows = y.shape().leading(1);
  for (std::int64_t r = 0; r < rows; ++r) {
    auto yr = detail::array_map(yc.data() + r * n, n);    // (N,)
    auto dyr = detail::array_map(dyc.data() + r * n, n);  // (N,)
    const T dot = T(detail::sum(yr * dyr));
    detail::assign_or_add(detail::array_map(dx.tensor.data() + r * n, n), yr * (dyr - dot), dx.accumulate);
  }
}

/// y = x - max - log(sum(exp(x - max))) over each row of the last dimension.
/// x, y: (..., N); y contiguous and may alias x.
template <FloatElement T>
void log_softmax_forward(const Tensor<T>& x, const Tensor<T>& y) {
  static_assert(detail::is_compute_float_v<T>, "log_softmax computes in float or double: cast half and bfloat16 tensors to float first");
  detail::check_rows("log_softmax", x);
  detail::check_output("log_softmax", "y", y, x.shape());
  const Tensor<T> xc = x.contiguous();
  const std::int64_t n = x.size(-1), rows = x.shape().leading(1);
  for (std::int64_t r = 0; r < rows; ++r) {
    auto xr = detail::array_map(xc.data() + r * n, n);  // (N,)
    const T m = xr.maxCoeff();
    const T lse = T(double(m) + std::log(detail::sum_exp_shift(xr.data(), m, n)));
    detail::array_map(y.data() + r * n, n) = xr - lse;
  }
}

/// dx (+)= dy - exp(y) sum(dy) per row, from the forward output y. y, dy, dx: (..., N).
template <FloatElement T>
void log_softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, const GradOut<T>& dx) {
  static_assert(detail::is_compute_float_v<T>, "log_softmax computes in float or double: cast half and bfloat16 tensors to float first");
  if (!dx.wanted()) return;
  check_same_shape("log_softmax backward", y.shape(), dy.shape());
  detail::check_output("log_softmax backward", "dx", dx.tensor, y.shape());
  const Tensor<T> yc = y.contiguous(), dyc = dy.contiguous();
  const std::int64_t n = y.size(-1), rows = y.shape().leading(1);
  alignas(64) T buf[detail::exp_block];  // exp(y) of one block of a row
  for (std::int64_t r = 0; r < rows; ++r) {
    const T total = T(detail::sum(detail::array_map(dyc.data() + r * n, n)));
    for (std::int64_t s = 0; s < n; s += detail::exp_block) {
      const std::int64_t m = std::min(detail::exp_block, n - s);
      detail::exp_shift_scale(yc.data() + r * n + s, T(0), total, buf, m);
      detail::assign_or_add(detail::array_map(dx.tensor.data() + r * n + s, m),
                            detail::array_map(dyc.data() + r * n + s, m) - detail::array_map(static_cast<const T*>(buf), m),
                            dx.accumulate);
    }
  }
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_SOFTMAX_INSTANCES(EXTERN, T) \
  EXTERN template void softmax_forward<T>(const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void softmax_backward<T>(const Tensor<T>&, const Tensor<T>&, const GradOut<T>&); \
  EXTERN template void log_softmax_forward<T>(const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void log_softmax_backward<T>(const Tensor<T>&, const Tensor<T>&, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_SOFTMAX_INSTANCES)

}  // namespace polyshard
