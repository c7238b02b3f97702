// Writing a computed gradient into a sink: overwrite the first contribution, add the rest.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/variable.hpp"
#include "polyshard/tensor/ops/elementwise.hpp"

namespace polyshard {

/// Stores `g` into the sink (same shape), adding when the sink already holds a gradient.
template <FloatElement T, Device D>
void accumulate_into(const GradSink<T, D>& sink, const Tensor<T, D>& g) {
  if (!sink.wanted()) return;
  check_same_shape("accumulate gradient", sink.tensor.shape(), g.shape());
  if (sink.accumulate) add_into(sink.tensor, g.contiguous(), sink.tensor);  // elementwise: may alias
  else sink.tensor.copy_from(g);
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_ACCUMULATE_INSTANCES(EXTERN, T) \
  EXTERN template void accumulate_into<T, Cpu>(const GradSink<T, Cpu>&, const Tensor<T, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_ACCUMULATE_INSTANCES)

}  // namespace polyshard
