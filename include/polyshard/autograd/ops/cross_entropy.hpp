// Differentiable cross-entropy loss of logits against integer targets, fused with its softmax.
#pragma once

#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/cross_entropy.hpp"
#include "polyshard/tensor/ops/reduce.hpp"

namespace polyshard {

/// Mean over all positions of -log softmax(logits)[target]. logits: (..., V); targets: (...)
/// in [0, V) (one out of range throws an Error naming it); returns a scalar (shape ()).
/// The gradient is (softmax(logits) - onehot(targets)) / N, rebuilt from logits and the saved
/// per-row log-sum-exp, (...), so no (..., V) probabilities are kept.
template <FloatElement T>
Var<T> cross_entropy(const Var<T>& logits, const Tensor<std::int32_t>& targets) {
  detail::check_cross_entropy("cross_entropy", logits.value(), targets);
  const Shape rows = detail::row_shape(logits.shape());
  const std::int64_t n = rows.numel();
  POLYSHARD_CHECK(n > 0, "cross_entropy: no positions in logits of shape ", logits.shape());
  Tensor<T> losses = Tensor<T>::empty(rows);  // (...)
  Tensor<T> lse = Tensor<T>::empty(rows);     // (...)
  cross_entropy_forward(logits.value(), targets, losses, lse);
  Tensor<T> y = Tensor<T>::full(Shape{}, T(mean(losses)));  // ()
  return make_result(std::move(y), "cross_entropy", {logits}, [targets, lse, n](Node<T>& self) {
    const Tensor<T> dlosses = Tensor<T>::full(lse.shape(), T(double(self.grad.data()[0]) / double(n)));  // (...)
    cross_entropy_backward(self.inputs[0]->value, targets, lse, dlosses, detail::grad_out(self, 0));
  });
}

}  // namespace polyshard
