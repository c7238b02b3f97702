// Differentiable layer normalization over the last dimension.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/layer_norm.hpp"

namespace polyshard {

/// (x - mean) / sqrt(var + eps) * weight + bias over the last dimension (biased variance).
/// x: (..., C); weight, bias: (C,). Returns (..., C). Saves the row means and reciprocal
/// standard deviations, (...) each, besides its inputs.
template <FloatElement T, Device D>
Var<T, D> layer_norm(const Var<T, D>& x, const Var<T, D>& weight, const Var<T, D>& bias, double eps = 1e-5) {
  const Shape& xs = x.shape();
  POLYSHARD_CHECK(xs.rank() >= 1, "layer_norm: input needs at least 1 dimension, got shape ", xs);
  Shape stats;
  for (int i = 0; i < xs.rank() - 1; ++i) stats.push_back(xs[i]);
  Tensor<T, D> y = Tensor<T, D>::empty(xs);        // (..., C)
  using S = detail::stats_t<T, D>;
  Tensor<S, D> mean = Tensor<S, D>::empty(stats);  // (...)
  Tensor<S, D> rstd = Tensor<S, D>::empty(stats);  // (...)
  layer_norm_forward(x.value(), weight.value(), bias.value(), eps, y, mean, rstd);
  return make_result(std::move(y), "layer_norm", {x, weight, bias}, [mean, rstd](Node<T, D>& self) {
    layer_norm_backward(self.inputs[0]->value, self.inputs[1]->value, mean, rstd, self.grad,
                        detail::grad_out(self, 0), detail::grad_out(self, 1), detail::grad_out(self, 2));
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_LAYER_NORM_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> layer_norm<T, Cpu>(const Var<T, Cpu>&, const Var<T, Cpu>&, const Var<T, Cpu>&, double);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_LAYER_NORM_INSTANCES)

}  // namespace polyshard
