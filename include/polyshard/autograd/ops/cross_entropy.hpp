// Differentiable cross-entropy loss of logits against integer targets, fused with its softmax.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/core/env_flag.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/autograd/ops/linear.hpp"
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

/// Whether a GPU's linear_cross_entropy writes the loss's gradient during its forward (where the
/// element type allows, logits_gradient_in_place): POLYSHARD_FUSED_LOSS=0 leaves it to the
/// backward, to compare the two in one build (read once).
inline bool loss_gradient_in_forward_enabled() {
  static const bool enabled = detail::on_unless_zero("POLYSHARD_FUSED_LOSS");
  return enabled;
}

/// cross_entropy(linear(x, weight), targets): a language model's head and its mean loss.
/// x: (..., C); weight: (V, C); targets: (...) in [0, V). On the host, the two ops. On a GPU, one
/// op with nothing waited for on the host:
/// - the logits go to a buffer whose rows are padded_vocab(V) long, from a copy of the weight
///   with zero rows up to that length (padded_head_weight, where V needs it), so that every
///   product over the vocabulary runs on a multiple of 64 whatever V is; the padding comes out
///   zero and is excluded from the softmax, the loss and the gradients;
/// - the mean loss is computed and kept on the device (read it with item() when needed);
/// - the logits' buffer becomes their gradient in place, so no second logits-sized buffer is
///   made: in the forward's one pass over it when a backward will run (bf16 and float: softmax -
///   onehot, with 1/N and the loss's gradient applied to the backward's products, the latter read
///   on the device), else (half) in the backward from the saved log-sum-exp.
template <FloatElement T, Device D>
Var<T, D> linear_cross_entropy(const Var<T, D>& x, const Var<T, D>& weight, const Tensor<std::int32_t, D>& targets) {
  if constexpr (std::same_as<D, Cpu>) {
    return cross_entropy(linear(x, weight), targets);
  } else {
    const Shape& xs = x.shape();
    const Shape& ws = weight.shape();
    POLYSHARD_CHECK(ws.rank() == 2 && xs.rank() >= 1 && xs.back() == ws[1], "linear_cross_entropy: input of shape ",
                    xs, " does not fit head weight of shape ", ws);
    const Shape rows_shape = detail::row_shape(xs);
    POLYSHARD_CHECK(targets.shape() == rows_shape, "linear_cross_entropy: targets of shape ", targets.shape(),
                    " do not fit input of shape ", xs, " (expected ", rows_shape, ")");
    const std::int64_t rows = rows_shape.numel();
    POLYSHARD_CHECK(rows > 0, "linear_cross_entropy: no positions in input of shape ", xs);
    const Tensor<T, D> x2 = x.value().contiguous().reshape({rows, ws[1]});
    const Tensor<std::int32_t, D> t2 = targets.contiguous().reshape({rows});
    const std::int64_t v = ws[0];
    const Tensor<T, D> head_weight = padded_head_weight(weight.value());  // (padded_vocab(V), C)
    auto logits = Tensor<T, D>::empty({rows, padded_vocab(v)}, MemoryCategory::Activations);
    // When a backward will run, the forward's pass over the logits also leaves their gradient
    // there (where T allows): a sweep runs each node's backward once and then releases it
    // (backward.hpp), and nothing else reads the logits.
    const bool recording = grad_enabled() && (x.requires_grad() || weight.requires_grad());
    const bool in_place = recording && logits_gradient_in_place<T> && loss_gradient_in_forward_enabled();
    const Tensor<float, D> lse =
        in_place ? Tensor<float, D>() : Tensor<float, D>::empty({rows}, MemoryCategory::Activations);
    Tensor<T, D> y = Tensor<T, D>::empty(Shape{});
    linear_cross_entropy_forward(x2, head_weight, v, t2, logits, lse, y, in_place);
    auto backward = [x2, head_weight, v, t2, logits, lse, in_place](Node<T, D>& self) {
      GradOut<T, D> dx = detail::grad_out(self, 0);
      if (dx.wanted()) dx.tensor = dx.tensor.reshape(x2.shape());
      linear_cross_entropy_backward(x2, head_weight, v, t2, logits, lse, self.grad, self.grad_factor, dx,
                                    detail::grad_out(self, 1), in_place);
    };
    return detail::reads_scalar_grad(
        make_result(std::move(y), "linear_cross_entropy", {x, weight}, std::move(backward)));
  }
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_CROSS_ENTROPY_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> cross_entropy<T, Cpu>(const Var<T, Cpu>&, const Tensor<std::int32_t, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_CROSS_ENTROPY_INSTANCES)

}  // namespace polyshard
