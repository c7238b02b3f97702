// What the optimizer step reads of a unit's reduced gradients before the update, on host
// tensors: the overflow check and the squared norm; and scaling in place, for an optimizer
// that cannot take the unscaling and clipping as a multiplier. Device twins of the same names
// live beside the device's kernels (engine/cuda/gradient_ops.hpp).
#pragma once

#include <atomic>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>

#include "polyshard/core/dtype.hpp"
#include "polyshard/optim/clip_grad_norm.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// Whether any element of `grads` is inf or NaN (the overflow check of a dynamic loss scale).
template <FloatElement G>
bool has_nonfinite(const Tensor<G, Cpu>& grads) {
  const std::span<const G> g(grads.span());
  std::atomic<bool> all{true};
  detail::parallel_ranges(g.size(), [&](std::size_t begin, std::size_t end) {
    bool ok = true;
    for (std::size_t i = begin; i < end; ++i) ok &= std::isfinite(static_cast<float>(g[i]));
    if (!ok) all.store(false, std::memory_order_relaxed);
  });
  return !all.load();
}

/// Whether squared_norm() of gradients of type G in the memory of D is inf or NaN exactly when
/// an element is, so that the norm doubles as the overflow check: on the host it sums in
/// double, which no finite square of a float reaches; the device sums in float, which no
/// square of a 16-bit value can overflow either.
template <class G, class D>
inline constexpr bool norm_sees_nonfinite = std::same_as<D, Cpu> || sizeof(G) == 2;

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
