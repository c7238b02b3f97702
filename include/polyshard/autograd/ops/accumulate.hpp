// Writing a computed gradient into a sink: overwrite the first contribution, add the rest.
#pragma once

#include "polyshard/autograd/variable.hpp"

namespace polyshard {

/// Stores `g` into the sink (same shape), adding when the sink already holds a gradient.
template <FloatElement T>
void accumulate_into(const GradSink<T>& sink, const Tensor<T>& g) {
  if (!sink.wanted()) return;
  check_same_shape("accumulate gradient", sink.tensor.shape(), g.shape());
  const Tensor<T> src = g.contiguous();
  T* dst = sink.tensor.data();
  const T* x = src.data();
  const std::int64_t n = g.numel();
  if (sink.accumulate) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] += x[i];
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = x[i];
  }
}

}  // namespace polyshard
