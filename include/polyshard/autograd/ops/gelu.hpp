// Differentiable GELU (tanh approximation, as in GPT-2's MLP).
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/gelu.hpp"

namespace polyshard {

/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise. x: any shape; returns that
/// shape. Saves nothing beyond its input.
template <FloatElement T, Device D>
Var<T, D> gelu(const Var<T, D>& x) {
  Tensor<T, D> y = Tensor<T, D>::empty(x.shape());  // same shape as x
  gelu_forward(x.value(), y);
  return make_result(std::move(y), "gelu", {x}, [](Node<T, D>& self) {
    gelu_backward(self.inputs[0]->value, self.grad, detail::grad_out(self, 0));
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_GELU_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> gelu<T, Cpu>(const Var<T, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_GELU_INSTANCES)

}  // namespace polyshard
