// Activation checkpointing: run a block without keeping its activations, and recompute them in
// backward. Costs one more forward of the block; saves everything it would have kept.
#pragma once

#include <utility>

#include "polyshard/autograd/backward.hpp"
#include "polyshard/autograd/ops/accumulate.hpp"

namespace polyshard {

/// Computes fn(x) under NoGradGuard and records one node whose backward re-runs fn with
/// recording on, then sweeps back through the recomputed graph. The gradients reaching x and
/// the parameters fn uses are the same as without checkpointing, provided fn is deterministic.
/// `fn` is copied into the graph: capture the module by reference, and keep it alive.
template <FloatElement T, Device D, class F>
Var<T, D> checkpoint(F fn, const Var<T, D>& x) {
  Tensor<T, D> y;
  {
    NoGradGuard no_grad;
    y = fn(Var<T, D>(x.value(), false)).value();
  }
  auto node = std::make_shared<Node<T, D>>();
  node->value = std::move(y);
  node->op = "checkpoint";
  if (!grad_enabled()) return Var<T, D>(std::move(node));
  // fn's parameters need gradients even when x does not, so the node always records.
  node->requires_grad = true;
  node->sweeps_again = true;
  node->inputs.push_back(x.node());
  node->backward = [fn = std::move(fn)](Node<T, D>& self) {
    Node<T, D>& input = *self.inputs[0];
    GradModeGuard recording(true);
    Var<T, D> x_again(input.value, input.requires_grad);
    Var<T, D> y_again = fn(x_again);
    if (!y_again.requires_grad()) return;
    backward(y_again, self.grad);
    if (input.requires_grad && x_again.grad().defined()) accumulate_into(input.sink(), x_again.grad());
  };
  return Var<T, D>(std::move(node));
}

}  // namespace polyshard
