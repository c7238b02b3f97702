// Layer normalization over the last dimension: forward and backward kernels.
#pragma once

#include <cmath>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

namespace detail {
/// The checks layer_norm_forward makes on either device. x, y: (..., C); weight, bias: (C,);
/// mean, rstd: (...).
template <class T, class S, class D>
void check_layer_norm_forward(const Tensor<T, D>& x, const Tensor<T, D>& weight, const Tensor<T, D>& bias,
                              const Tensor<T, D>& y, const Tensor<S, D>& mean, const Tensor<S, D>& rstd) {
  POLYSHARD_CHECK(x.rank() >= 1, "layer_norm: input needs at least 1 dimension, got shape ", x.shape());
  const std::int64_t c = x.size(-1);
  POLYSHARD_CHECK(weight.shape() == Shape{c}, "layer_norm: weight of shape ", weight.shape(),
                  " does not fit input of shape ", x.shape());
  POLYSHARD_CHECK(bias.shape() == Shape{c}, "layer_norm: bias of shape ", bias.shape(),
                  " does not fit input of shape ", x.shape());
  Shape stats_shape;
  for (int i = 0; i < x.rank() - 1; ++i) stats_shape.push_back(x.size(i));
  check_output("layer_norm", "y", y, x.shape());
  check_output("layer_norm", "mean", mean, stats_shape);
  check_output("layer_norm", "rstd", rstd, stats_shape);
}

/// The checks layer_norm_backward makes on either device. x, dy: (..., C); weight: (C,);
/// mean, rstd: (...).
template <class T, class S, class D>
void check_layer_norm_backward(const Tensor<T, D>& x, const Tensor<T, D>& weight, const Tensor<S, D>& mean,
                               const Tensor<S, D>& rstd, const Tensor<T, D>& dy, const GradOut<T, D>& dx,
                               const GradOut<T, D>& dweight, const GradOut<T, D>& dbias) {
  check_same_shape("layer_norm backward", x.shape(), dy.shape());
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  POLYSHARD_CHECK(weight.shape() == Shape{c} && mean.numel() == rows && rstd.numel() == rows,
                  "layer_norm backward: weight ", weight.shape(), ", mean ", mean.shape(), " and rstd ",
                  rstd.shape(), " do not fit input of shape ", x.shape());
  if (dx.wanted()) check_output("layer_norm backward", "dx", dx.tensor, x.shape());
  if (dweight.wanted()) check_output("layer_norm backward", "dweight", dweight.tensor, Shape{c});
  if (dbias.wanted()) check_output("layer_norm backward", "dbias", dbias.tensor, Shape{c});
}
}  // namespace detail

/// y = (x - mean) * rstd * weight + bias over each row of the last dimension, with
/// rstd = 1 / sqrt(var + eps) (biased variance). Row statistics are summed in blocks added in double.
/// x, y: (..., C); weight, bias: (C,); mean, rstd: (...) (x's shape without its last dimension),
/// written for the backward pass. Outputs contiguous.
template <FloatElement T>
void layer_norm_forward(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& bias, double eps,
                        const Tensor<T>& y, const Tensor<T>& mean, const Tensor<T>& rstd) {
  static_assert(detail::is_compute_float_v<T>,
                "layer_norm computes in float or double: cast half and bfloat16 tensors to float first");
  detail::check_layer_norm_forward(x, weight, bias, y, mean, rstd);
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  const Tensor<T> xc = x.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
  auto w = detail::array_map(wc.data(), c);
  auto b = detail::array_map(bc.data(), c);
  for (std::int64_t r = 0; r < rows; ++r) {
    auto xr = detail::array_map(xc.data() + r * c, c);  // (C,)
    // Two passes (mean, then squared deviations): no cancellation when |mean| >> std.
    const double mu = detail::sum(xr) / double(c);
    const double var = detail::sum((xr - T(mu)).square()) / double(c);
    const T rs = T(1.0 / std::sqrt(var + eps));
    mean.data()[r] = T(mu);
    rstd.data()[r] = rs;
    detail::array_map(y.data() + r * c, c) = (xr - T(mu)) * rs * w + b;
  }
}

/// Gradients of layer_norm_forward. With xhat = (x - mean) rstd and g = dy weight:
/// dx = rstd (g - mean(g) - xhat mean(g xhat)) per row, dweight = sum over rows of dy xhat,
/// dbias = sum over rows of dy. x, dy: (..., C); weight: (C,); mean, rstd: (...) from the
/// forward pass; dx: (..., C), dweight, dbias: (C,), each skipped when not wanted.
template <FloatElement T>
void layer_norm_backward(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& mean,
                         const Tensor<T>& rstd, const Tensor<T>& dy, const GradOut<T>& dx,
                         const GradOut<T>& dweight, const GradOut<T>& dbias) {
  static_assert(detail::is_compute_float_v<T>,
                "layer_norm computes in float or double: cast half and bfloat16 tensors to float first");
  detail::check_layer_norm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias);
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  const Tensor<T> xc = x.contiguous(), dyc = dy.contiguous(), wc = weight.contiguous();
  const Tensor<T> mc = mean.contiguous(), rc = rstd.contiguous();
  auto w = detail::array_map(wc.data(), c);
  if (dweight.wanted() && !dweight.accumulate) dweight.tensor.fill(T(0));
  if (dbias.wanted() && !dbias.accumulate) dbias.tensor.fill(T(0));
  // One row of xhat at a time, reused by dx and dweight without a second pass over x.
  Tensor<T> xhat_buf = Tensor<T>::empty({c});  // (C,)
  auto xhat = detail::array_map(xhat_buf.data(), c);
  for (std::int64_t r = 0; r < rows; ++r) {
    auto xr = detail::array_map(xc.data() + r * c, c);   // (C,)
    auto dyr = detail::array_map(dyc.data() + r * c, c);  // (C,)
    const T rs = rc.data()[r];
    xhat = (xr - mc.data()[r]) * rs;
    if (dweight.wanted()) detail::array_map(dweight.tensor.data(), c) += dyr * xhat;
    if (dbias.wanted()) detail::array_map(dbias.tensor.data(), c) += dyr;
    if (dx.wanted()) {
      const double g_mean = detail::sum(dyr * w) / double(c);
      const double gx_mean = detail::sum(dyr * w * xhat) / double(c);
      detail::assign_or_add(detail::array_map(dx.tensor.data() + r * c, c),
                            rs * (dyr * w - T(g_mean) - xhat * T(gx_mean)), dx.accumulate);
    }
  }
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_LAYER_NORM_INSTANCES(EXTERN, T) \
  EXTERN template void layer_norm_forward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, double, \
                                             const Tensor<T>&, const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void layer_norm_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, \
                                              const Tensor<T>&, const Tensor<T>&, const GradOut<T>&, \
                                              const GradOut<T>&, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_LAYER_NORM_INSTANCES)

}  // namespace polyshard
