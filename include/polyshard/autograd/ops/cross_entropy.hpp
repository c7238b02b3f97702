// Differentiable cross-entropy loss of logits against integer targets, fused with its softmax.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/cross_entropy.hpp"
#include "polyshard/tensor/ops/reduce.hpp"

namespace polyshard {

/// Mean over all positions of -log softmax(logits)[target]. logits: (..., V); targets: (...)
/// in [0, V) (one out of range throws an Error naming it); returns a scalar (shape ()).
/// The gradient is (softmax(logits) - onehot(targets)) / N, rebuilt from logits and the saved
/// per-row log-sum-exp, (...), so no (..., V) probabilities are kept.
template <FloatElement T, Device D>
Var<T, D> cross_entropy(const Var<T, D>& logits, const Tensor<std::int32_t, D>& targets) {
  detail::check_cross_entropy("cross_entropy", logits.value(), targets);
  const Shape rows = detail::row_shape(logits.shape());
  const std::int64_t n = rows.numel();
  POLYSHARD_CHECK(n > 0, "cross_entropy: no positions in logits of shape ", logits.shape());
  using S = detail::stats_t<T, D>;
  Tensor<S, D> losses = Tensor<S, D>::empty(rows);  // (...)
  Tensor<S, D> lse = Tensor<S, D>::empty(rows);     // (...)
  cross_entropy_forward(logits.value(), targets, losses, lse);
  Tensor<T, D> y = Tensor<T, D>::full(Shape{}, T(mean(losses)));  // ()
  return detail::reads_scalar_grad(
      make_result(std::move(y), "cross_entropy", {logits}, [targets, lse, n](Node<T, D>& self) {
        const auto dlosses = Tensor<S, D>::full(lse.shape(), S(detail::scalar_grad(self) / double(n)));  // (...)
        cross_entropy_backward(self.inputs[0]->value, targets, lse, dlosses, detail::grad_out(self, 0));
      }));
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_CROSS_ENTROPY_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> cross_entropy<T, Cpu>(const Var<T, Cpu>&, const Tensor<std::int32_t, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_CROSS_ENTROPY_INSTANCES)

}  // namespace polyshard
