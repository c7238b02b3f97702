// Differentiable SiLU (swish), the gate of a SwiGLU feed-forward layer.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/silu.hpp"

namespace polyshard {

/// x sigmoid(x), elementwise, as torch.nn.functional.silu. x: any shape; returns that shape.
/// Saves nothing beyond its input.
template <FloatElement T, Device D>
Var<T, D> silu(const Var<T, D>& x) {
  Tensor<T, D> y = Tensor<T, D>::empty(x.shape());  // same shape as x
  silu_forward(x.value(), y);
  return make_result(std::move(y), "silu", {x}, [](Node<T, D>& self) {
    silu_backward(self.inputs[0]->value, self.grad, detail::grad_out(self, 0));
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_SILU_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> silu<T, Cpu>(const Var<T, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_SILU_INSTANCES)

}  // namespace polyshard
