// A linear layer's kernels, y = x W^T + b and its three gradients, with PyTorch's (out, in)
// weight layout. On the host: the matrix products and a pass for the bias; the device's twins
// (tensor/cuda/ops.hpp) fold the bias and its gradient into the products' epilogues.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"
#include "polyshard/tensor/ops/matmul.hpp"

namespace polyshard {

namespace detail {
/// Checks a linear layer's operands: x (R, in), weight (out, in), bias (out) or undefined,
/// y (R, out) contiguous.
template <class T, class D>
void check_linear(const char* op, const Tensor<T, D>& x, const Tensor<T, D>& weight, const Tensor<T, D>& bias,
                  const Tensor<T, D>& y) {
  POLYSHARD_CHECK(x.rank() == 2 && weight.rank() == 2 && x.size(1) == weight.size(1), op, ": input of shape ",
                  x.shape(), " does not fit weight of shape ", weight.shape(), " (expected (rows, ",
                  weight.rank() == 2 ? weight.size(1) : -1, "))");
  if (bias.defined())
    POLYSHARD_CHECK(bias.shape() == Shape{weight.size(0)}, op, ": bias of shape ", bias.shape(),
                    " does not fit weight of shape ", weight.shape());
  detail::check_output(op, "y", y, Shape{x.size(0), weight.size(0)});
}
}  // namespace detail

/// y = x weight^T (+ bias, when defined). x: (R, in); weight: (out, in); bias: (out) or
/// undefined; y: (R, out), contiguous.
template <FloatElement T>
void linear_forward(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& bias, const Tensor<T>& y) {
  detail::check_linear("linear", x, weight, bias, y);
  matmul_into(x, weight.transpose(), y);
  if (!bias.defined()) return;
  const Tensor<T> b = bias.contiguous();
  const std::int64_t n = b.numel(), rows = y.size(0);
  T* py = y.data();
  const T* pb = b.data();
  for (std::int64_t r = 0; r < rows; ++r, py += n)
    for (std::int64_t j = 0; j < n; ++j) py[j] += pb[j];
}

/// The gradients of linear_forward from dy (R, out): dx (R, in) = dy weight, dweight (out, in)
/// = dy^T x, dbias (out) = the column sums of dy; each written or added to as its GradOut says,
/// an undefined one skipped.
template <FloatElement T>
void linear_backward(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& dy, const GradOut<T>& dx,
                     const GradOut<T>& dweight, const GradOut<T>& dbias) {
  check_same_shape("linear backward", dy.shape(), Shape{x.size(0), weight.size(0)});
  if (dx.wanted()) matmul_into(dy, weight, dx.tensor, T(1), T(dx.accumulate));
  if (dweight.wanted()) matmul_into(dy.transpose(), x, dweight.tensor, T(1), T(dweight.accumulate));
  if (!dbias.wanted()) return;
  detail::check_output("linear backward", "dbias", dbias.tensor, Shape{weight.size(0)});
  const Tensor<T> g = dy.contiguous();
  const std::int64_t n = dbias.tensor.numel(), rows = g.size(0);
  T* po = dbias.tensor.data();
  if (!dbias.accumulate) std::fill_n(po, n, T(0));
  const T* pg = g.data();
  for (std::int64_t r = 0; r < rows; ++r, pg += n)
    for (std::int64_t j = 0; j < n; ++j) po[j] += pg[j];
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_LINEAR_INSTANCES(EXTERN, T) \
  EXTERN template void linear_forward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void linear_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, \
                                          const GradOut<T>&, const GradOut<T>&, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_LINEAR_INSTANCES)

}  // namespace polyshard
