// Handing an input's gradient slot (GradSink) to a tensor backward kernel (GradOut).
#pragma once

#include "polyshard/autograd/variable.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard::detail {

/// The gradient output of input `i` of `self`, undefined when that input needs no gradient.
/// Claiming it marks the input as holding a gradient, so call it only when the kernel runs.
template <FloatElement T, Device D>
GradOut<T, D> grad_out(Node<T, D>& self, std::size_t i) {
  GradSink<T, D> s = self.inputs[i]->sink();
  return {std::move(s.tensor), s.accumulate};
}

}  // namespace polyshard::detail
