// Root-mean-square normalization over the last dimension (torch.nn.RMSNorm, Llama's norm):
// forward and backward kernels.
#pragma once

#include <cmath>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

namespace detail {
/// The checks rms_norm_backward makes on either device. x, dy: (..., C); weight: (C,); rstd: (...).
template <class T, class S, class D>
void check_rms_norm_backward(const Tensor<T, D>& x, const Tensor<T, D>& weight, const Tensor<S, D>& rstd,
                             const Tensor<T, D>& dy, const GradOut<T, D>& dx, const GradOut<T, D>& dweight) {
  check_same_shape("rms_norm backward", x.shape(), dy.shape());
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  POLYSHARD_CHECK(weight.shape() == Shape{c} && rstd.numel() == rows, "rms_norm backward: weight ", weight.shape(),
                  " and rstd ", rstd.shape(), " do not fit input of shape ", x.shape());
  if (dx.wanted()) check_output("rms_norm backward", "dx", dx.tensor, x.shape());
  if (dweight.wanted()) check_output("rms_norm backward", "dweight", dweight.tensor, Shape{c});
}
}  // namespace detail

/// y = x * rstd * weight over each row of the last dimension, rstd = 1 / sqrt(mean(x^2) + eps):
/// eps inside the square root, no mean subtracted and no bias, as torch.nn.RMSNorm. The sum of
/// squares is added in double. x, y: (..., C); weight: (C,); rstd: (...) (x's shape without its
/// last dimension), written for the backward pass. Outputs contiguous.
template <FloatElement T>
void rms_norm_forward(const Tensor<T>& x, const Tensor<T>& weight, double eps, const Tensor<T>& y,
                      const Tensor<T>& rstd) {
  static_assert(detail::is_compute_float_v<T>,
                "rms_norm computes in float or double: cast half and bfloat16 tensors to float first");
  POLYSHARD_CHECK(x.rank() >= 1, "rms_norm: input needs at least 1 dimension, got shape ", x.shape());
  POLYSHARD_CHECK(eps >= 0.0, "rms_norm: eps must not be negative, got ", eps);
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  POLYSHARD_CHECK(weight.shape() == Shape{c}, "rms_norm: weight of shape ", weight.shape(),
                  " does not fit input of shape ", x.shape());
  Shape stats_shape;
  for (int i = 0; i < x.rank() - 1; ++i) stats_shape.push_back(x.size(i));
  detail::check_output("rms_norm", "y", y, x.shape());
  detail::check_output("rms_norm", "rstd", rstd, stats_shape);
  const Tensor<T> xc = x.contiguous(), wc = weight.contiguous();
  auto w = detail::array_map(wc.data(), c);
  for (std::int64_t r = 0; r < rows; ++r) {
    auto xr = detail::array_map(xc.data() + r * c, c);  // (C,)
    const T rs = T(1.0 / std::sqrt(detail::sum(xr.square()) / double(c) + eps));
    rstd.data()[r] = rs;
    detail::array_map(y.data() + r * c, c) = xr * rs * w;
  }
}

/// Gradients of rms_norm_forward. With xhat = x rstd and g = dy weight:
/// dx = rstd (g - xhat mean(g xhat)) per row (rstd depends on x through mean(x^2)), and
/// dweight = sum over rows of dy xhat. x, dy: (..., C); weight: (C,); rstd: (...) from the
/// forward pass; dx: (..., C), dweight: (C,), each skipped when not wanted.
template <FloatElement T>
void rms_norm_backward(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& rstd, const Tensor<T>& dy,
                       const GradOut<T>& dx, const GradOut<T>& dweight) {
  static_assert(detail::is_compute_float_v<T>,
                "rms_norm computes in float or double: cast half and bfloat16 tensors to float first");
  detail::check_rms_norm_backward(x, weight, rstd, dy, dx, dweight);
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  const Tensor<T> xc = x.contiguous(), dyc = dy.contiguous(), wc = weight.contiguous(), rc = rstd.contiguous();
  auto w = detail::array_map(wc.data(), c);
  if (dweight.wanted() && !dweight.accumulate) dweight.tensor.fill(T(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    auto xr = detail::array_map(xc.data() + r * c, c);   // (C,)
    auto dyr = detail::array_map(dyc.data() + r * c, c);  // (C,)
    const T rs = rc.data()[r];
    if (dweight.wanted()) detail::array_map(dweight.tensor.data(), c) += dyr * xr * rs;
    if (dx.wanted()) {
      const double gx_mean = detail::sum(dyr * w * xr * rs) / double(c);
      detail::assign_or_add(detail::array_map(dx.tensor.data() + r * c, c), rs * (dyr * w - xr * rs * T(gx_mean)),
                            dx.accumulate);
    }
  }
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_RMS_NORM_INSTANCES(EXTERN, T) \
  EXTERN template void rms_norm_forward<T>(const Tensor<T>&, const Tensor<T>&, double, const Tensor<T>&, \
                                           const Tensor<T>&); \
  EXTERN template void rms_norm_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, \
                                            const GradOut<T>&, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_RMS_NORM_INSTANCES)

}  // namespace polyshard
