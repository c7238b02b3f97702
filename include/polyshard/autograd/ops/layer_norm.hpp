// Differentiable layer normalization over the last dimension.
#pragma once

#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/layer_norm.hpp"

namespace polyshard {

/// (x - mean) / sqrt(var + eps) * weight + bias over the last dimension (biased variance).
/// x: (..., C); weight, bias: (C,). Returns (..., C). Saves the row means and reciprocal
/// standard deviations, (...) each, besides its inputs.
template <FloatElement T>
Var<T> layer_norm(const Var<T>& x, const Var<T>& weight, const Var<T>& bias, double eps = 1e-5) {
  const Shape& xs = x.shape();
  POLYSHARD_CHECK(xs.rank() >= 1, "layer_norm: input needs at least 1 dimension, got shape ", xs);
  Shape stats;
  for (int i = 0; i < xs.rank() - 1; ++i) stats.push_back(xs[i]);
  Tensor<T> y = Tensor<T>::empty(xs);        // (..., C)
  Tensor<T> mean = Tensor<T>::empty(stats);  // (...)
  Tensor<T> rstd = Tensor<T>::empty(stats);  // (...)
  layer_norm_forward(x.value(), weight.value(), bias.value(), eps, y, mean, rstd);
  return make_result(std::move(y), "layer_norm", {x, weight, bias}, [mean, rstd](Node<T>& self) {
    layer_norm_backward(self.inputs[0]->value, self.inputs[1]->value, mean, rstd, self.grad,
                        detail::grad_out(self, 0), detail::grad_out(self, 1), detail::grad_out(self, 2));
  });
}

}  // namespace polyshard
