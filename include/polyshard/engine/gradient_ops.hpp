// What the optimizer step does to a unit's reduced gradients before the update, on host
// tensors: unscaling with the overflow check, the squared norm, and scaling (clipping). Device
// twins of the same names live beside the device's kernels (engine/cuda/gradient_ops.hpp).
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <span>

#include "polyshard/core/dtype.hpp"
#include "polyshard/optim/clip_grad_norm.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// Multiplies `grads` by `inv_scale` (unless it is 1) and returns whether any element was inf or
/// NaN before or after. The elements are scaled even then: a step that overflowed is skipped.
template <FloatElement G>
bool unscale_and_check(const Tensor<G, Cpu>& grads, double inv_scale) {
  const auto finite = [&] {
    const std::span<const G> g(grads.span());
    std::atomic<bool> all{true};
    detail::parallel_ranges(g.size(), [&](std::size_t begin, std::size_t end) {
      bool ok = true;
      for (std::size_t i = begin; i < end; ++i) ok &= std::isfinite(static_cast<float>(g[i]));
      if (!ok) all.store(false, std::memory_order_relaxed);
    });
    return all.load();
  };
  if (!finite()) return true;
  if (inv_scale == 1.0) return false;
  scale_span(grads.span(), inv_scale);
  return !finite();
}

/// Sum of the squares of `grads`, accumulated in double.
template <FloatElement G>
double squared_norm(const Tensor<G, Cpu>& grads) {
  return squared_norm(std::span<const G>(grads.span()));
}

/// grads *= factor (in float for the 16-bit types).
template <FloatElement G>
void scale_gradients(const Tensor<G, Cpu>& grads, double factor) {
  scale_span(grads.span(), factor);
}

}  // namespace polyshard
