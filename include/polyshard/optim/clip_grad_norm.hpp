// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_ does it.
#pragma once

#include <cmath>
#include <span>

#include "polyshard/core/dtype.hpp"

namespace polyshard {

/// Sum of squares of a gradient span, accumulated in double. Sharded strategies add these
/// partial sums across ranks before taking the root, so the norm is that of the whole gradient.
template <FloatElement G>
double squared_norm(std::span<const G> grads) {
  double s = 0;
  for (const G& g : grads) {
    const double x = static_cast<double>(static_cast<compute_t<G>>(g));
    s += x * x;
  }
  return s;
}

/// Multiplies every element by `factor` (computing in float for the 16-bit types).
template <FloatElement G>
void scale_span(std::span<G> grads, double factor) {
  const auto f = static_cast<compute_t<G>>(factor);
  for (G& g : grads) g = static_cast<G>(static_cast<compute_t<G>>(g) * f);
}

/// torch.nn.utils.clip_grad_norm_'s coefficient for a gradient of norm `total_norm`: what it is
/// scaled by to clip it to `max_norm`, applied only when below 1.
inline double clip_coefficient(double total_norm, double max_norm) { return max_norm / (total_norm + 1e-6); }

/// Scales `grads` by clip_coefficient() when their norm exceeds `max_norm`, given the norm of
/// the whole gradient (which may span ranks). Returns the clip coefficient applied.
template <FloatElement G>
double scale_to_norm(std::span<G> grads, double total_norm, double max_norm) {
  const double coefficient = clip_coefficient(total_norm, max_norm);
  if (coefficient >= 1.0) return 1.0;
  scale_span(grads, coefficient);
  return coefficient;
}

/// Clips a whole gradient held in one span to `max_norm` (infinity: measure only).
/// Returns the norm before clipping.
template <FloatElement G>
double clip_grad_norm(std::span<G> grads, double max_norm) {
  const double norm = std::sqrt(squared_norm(std::span<const G>(grads)));
  if (std::isfinite(max_norm)) scale_to_norm(grads, norm, max_norm);
  return norm;
}

}  // namespace polyshard
