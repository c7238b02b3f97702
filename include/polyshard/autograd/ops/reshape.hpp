// Differentiable reshape: a view of the same elements; the gradient is reshaped back.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/accumulate.hpp"

namespace polyshard {

/// x with a new shape of the same element count (one extent may be -1). A view when x's value
/// is contiguous, else a contiguous copy. Returns (shape).
template <FloatElement T, Device D>
Var<T, D> reshape(const Var<T, D>& x, Shape shape) {
  Tensor<T, D> y = x.value().contiguous().reshape(shape);
  return make_result(std::move(y), "reshape", {x}, [](Node<T, D>& self) {
    accumulate_into(self.inputs[0]->sink(), self.grad.contiguous().reshape(self.inputs[0]->value.shape()));
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_RESHAPE_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> reshape<T, Cpu>(const Var<T, Cpu>&, Shape);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_RESHAPE_INSTANCES)

}  // namespace polyshard
