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
template <FloatElement T, class F>
Var<T> checkpoint(F fn, const Var<T>& x) {
  Tensor<T> y;
  {
    NoGradGuard no_grad;
    y = fn(Var<T>(x.value(), false)).value();
  }
  auto node = std::make_shared<Node<T>>();
  node->value = std::move(y);
  node->op = "checkpoint";
  if (!grad_enabled()) return Var<T>(std::move(node));
  // fn's parameters need gradients even when x does not, so the node always records.
  node->requires_grad = true;
  node->inputs.push_back(x.node());
  node->backward = [fn = std::move(fn)](Node<T>& self) {
    Node<T>& input = *self.inputs[0];
    GradModeGuard recording(true);
    Var<T> x_again(input.value, input.requires_grad);
    Var<T> y_again = fn(x_again);
    if (!y_again.requires_grad()) return;
    backward(y_again, self.grad);
    if (input.requires_grad && x_again.grad().defined()) accumulate_into(input.sink(), x_again.grad());
  };
  return Var<T>(std::move(node));
}

}  // namespace polyshard
