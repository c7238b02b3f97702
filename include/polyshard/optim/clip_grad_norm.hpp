// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_ does it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "polyshard/core/dtype.hpp"
#include "polyshard/optim/detail/elementwise.hpp"
#include "polyshard/optim/detail/x86_vectors.hpp"

namespace polyshard {

namespace detail {
// The squared norm's fixed summation order: blocks of this many elements, each summed in
// `norm_lanes` interleaved accumulators, the block sums then added in order. Independent
// accumulators break the one long chain of dependent additions (4 cycles each): 32 of them, as
// four AVX-512 (or eight AVX2) vectors of doubles, let a core sum as fast as memory delivers,
// where 8 held it to 8 values every 4 cycles. Fixed blocks make the result the same on any
// number of threads, and the vector kernels (add_squares) keep the scalar lanes' order, so it
// is the same on any instruction set.
inline constexpr std::size_t norm_block = std::size_t{1} << 13;
inline constexpr std::size_t norm_lanes = 32;

template <class G>
double squared_norm_block(const G* g, std::size_t n, CpuIsa isa) {
  std::array<double, norm_lanes> acc{};
  std::size_t i = vector_add_squares<norm_lanes>(isa, n, g, acc.data());
  for (; i + norm_lanes <= n; i += norm_lanes)
    for (std::size_t j = 0; j < norm_lanes; ++j) {
      const double x = static_cast<double>(static_cast<compute_t<G>>(g[i + j]));
      acc[j] += x * x;
    }
  for (std::size_t j = 0; i + j < n; ++j) {
    const double x = static_cast<double>(static_cast<compute_t<G>>(g[i + j]));
    acc[j] += x * x;
  }
  double s = 0;
  for (double a : acc) s += a;
  return s;
}
}  // namespace detail

/// Sum of squares of a gradient span, accumulated in double, in a fixed order that depends on
/// neither the number of threads (set_optimizer_threads) nor the instruction set. Sharded
/// strategies add these partial sums across ranks before taking the root, so the norm is that
/// of the whole gradient.
template <FloatElement G>
double squared_norm(std::span<const G> grads) {
  const std::size_t blocks = (grads.size() + detail::norm_block - 1) / detail::norm_block;
  std::vector<double> sums(blocks);
  // Threads take whole blocks: each block's sum is the same on any thread.
  const CpuIsa isa = optimizer_isa();
  detail::parallel_ranges(blocks, [&](std::size_t begin, std::size_t end) {
    for (std::size_t b = begin; b < end; ++b) {
      const std::size_t first = b * detail::norm_block;
      sums[b] = detail::squared_norm_block(grads.data() + first, std::min(detail::norm_block, grads.size() - first),
                                           isa);
    }
  }, detail::min_elements_per_thread / detail::norm_block);
  double s = 0;
  for (double b : sums) s += b;
  return s;
}

/// Multiplies every element by `factor` (computing in float for the 16-bit types), split across
/// the worker pool: the same bits on any number of threads.
template <FloatElement G>
void scale_span(std::span<G> grads, double factor) {
  const auto f = static_cast<compute_t<G>>(factor);
  const CpuIsa isa = optimizer_isa();
  detail::parallel_ranges(grads.size(), [&](std::size_t begin, std::size_t end) {
    if constexpr (std::is_same_v<compute_t<G>, float>)
      if (detail::vector_scale_range(isa, end - begin, grads.data() + begin, f)) return;
    for (std::size_t i = begin; i < end; ++i) grads[i] = static_cast<G>(static_cast<compute_t<G>>(grads[i]) * f);
  });
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
