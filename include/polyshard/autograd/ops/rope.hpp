// Differentiable rotary position embeddings (the rotate-half layout of Hugging Face's Llama).
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/rope.hpp"

namespace polyshard {

/// Queries or keys x: (B, T, H, head_dim) turned by their positions t + offset (see
/// rope_forward). Returns (B, T, H, head_dim). Saves nothing: backward turns the gradient back.
template <FloatElement T, Device D>
Var<T, D> rope(const Var<T, D>& x, double theta = 10000.0, std::int64_t offset = 0) {
  Tensor<T, D> y = Tensor<T, D>::empty(x.shape());  // same shape as x
  rope_forward(x.value(), theta, offset, y);
  return make_result(std::move(y), "rope", {x}, [theta, offset](Node<T, D>& self) {
    rope_backward(self.grad, theta, offset, detail::grad_out(self, 0));
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_ROPE_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> rope<T, Cpu>(const Var<T, Cpu>&, double, std::int64_t);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_ROPE_INSTANCES)

}  // namespace polyshard
