// Differentiable softmax and log-softmax over the last dimension.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/softmax.hpp"

namespace polyshard {

/// exp(x) / sum(exp(x)) over the last dimension, computed stably. x: (..., N); returns (..., N).
/// The backward pass reads the node's own output, so nothing else is saved.
template <FloatElement T, Device D>
Var<T, D> softmax(const Var<T, D>& x) {
  Tensor<T, D> y = Tensor<T, D>::empty(x.shape());  // (..., N)
  softmax_forward(x.value(), y);
  return make_result(std::move(y), "softmax", {x}, [](Node<T, D>& self) {
    softmax_backward(self.value, self.grad, detail::grad_out(self, 0));
  });
}

/// x - log(sum(exp(x))) over the last dimension, computed stably. x: (..., N); returns (..., N).
template <FloatElement T, Device D>
Var<T, D> log_softmax(const Var<T, D>& x) {
  Tensor<T, D> y = Tensor<T, D>::empty(x.shape());  // (..., N)
  log_softmax_forward(x.value(), y);
  return make_result(std::move(y), "log_softmax", {x}, [](Node<T, D>& self) {
    log_softmax_backward(self.value, self.grad, detail::grad_out(self, 0));
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_SOFTMAX_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> softmax<T, Cpu>(const Var<T, Cpu>&); \
  EXTERN template Var<T, Cpu> log_softmax<T, Cpu>(const Var<T, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_SOFTMAX_INSTANCES)

}  // namespace polyshard
