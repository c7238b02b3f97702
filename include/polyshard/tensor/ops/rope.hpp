// Rotary position embeddings (RoFormer), in the rotate-half layout of Hugging Face's Llama:
// forward and backward kernels.
#pragma once

#include <cmath>
#include <vector>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

/// The angle pair i of a head of dimension d turns by at position p: p theta^(-2i/d), in double.
inline double rope_angle(std::int64_t position, std::int64_t i, std::int64_t head_dim, double theta) {
  return double(position) * std::pow(theta, -2.0 * double(i) / double(head_dim));
}

namespace detail {
/// The checks rope_forward and rope_backward share. x: (B, T, H, d).
template <class T, class D>
void check_rope(const char* op, const Tensor<T, D>& x, double theta, std::int64_t offset) {
  POLYSHARD_CHECK(x.rank() == 4, op, ": input must be (batch, positions, heads, head_dim), got shape ", x.shape());
  POLYSHARD_CHECK(x.size(3) > 0 && x.size(3) % 2 == 0, op, ": head_dim must be even and positive, got ", x.size(3),
                  " in shape ", x.shape());
  POLYSHARD_CHECK(theta > 0.0, op, ": theta must be positive, got ", theta);
  POLYSHARD_CHECK(offset >= 0, op, ": the position offset must not be negative, got ", offset);
}

/// out (+)= x with each pair (i, i + d/2) of a row at position p turned by sign * angle(p, i).
template <FloatElement T>
void rope_rotate(const char* op, const Tensor<T>& x, double theta, std::int64_t offset, double sign,
                 const GradOut<T>& out) {
  static_assert(is_compute_float_v<T>, "rope computes in float or double: cast half and bfloat16 tensors to float first");
  check_rope(op, x, theta, offset);
  if (!out.wanted()) return;
  check_output(op, "output", out.tensor, x.shape());
  const std::int64_t b = x.size(0), t = x.size(1), h = x.size(2), d = x.size(3), half = d / 2;
  // cos and sin of every (position, pair), in double, then rounded to T.
  std::vector<T> cosines(static_cast<std::size_t>(t * half)), sines(cosines.size());
  for (std::int64_t p = 0; p < t; ++p)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = sign * rope_angle(p + offset, i, d, theta);
      cosines[std::size_t(p * half + i)] = T(std::cos(angle));
      sines[std::size_t(p * half + i)] = T(std::sin(angle));
    }
  const Tensor<T> xc = x.contiguous();
  for (std::int64_t row = 0; row < b * t * h; ++row) {
    const std::int64_t p = (row / h) % t;
    const T* xr = xc.data() + row * d;
    T* yr = out.tensor.data() + row * d;
    const T* c = cosines.data() + p * half;
    const T* s = sines.data() + p * half;
    for (std::int64_t i = 0; i < half; ++i) {
      const T lo = xr[i] * c[i] - xr[i + half] * s[i];
      const T hi = xr[i + half] * c[i] + xr[i] * s[i];
      yr[i] = out.accumulate ? yr[i] + lo : lo;
      yr[i + half] = out.accumulate ? yr[i + half] + hi : hi;
    }
  }
}
}  // namespace detail

/// Rotary position embedding of x: (B, T, H, d), d even, the row at (b, t, h) at position
/// t + offset (offset: the positions already in a key-value cache). Each pair (i, i + d/2),
/// i < d/2, turns by the angle a = (t + offset) theta^(-2i/d):
///   y[i] = x[i] cos a - x[i + d/2] sin a,   y[i + d/2] = x[i + d/2] cos a + x[i] sin a,
/// Hugging Face's q * cos + rotate_half(q) * sin (theta 10000 in Llama 2, 500000 in Llama 3).
/// Angles, cosines and sines in double, rounded to T. y: (B, T, H, d), contiguous.
template <FloatElement T>
void rope_forward(const Tensor<T>& x, double theta, std::int64_t offset, const Tensor<T>& y) {
  detail::rope_rotate("rope", x, theta, offset, 1.0, GradOut<T>{y, false});
}

/// dx (+)= dy turned back by each pair's angle: the rotation's transpose is its inverse.
template <FloatElement T>
void rope_backward(const Tensor<T>& dy, double theta, std::int64_t offset, const GradOut<T>& dx) {
  detail::rope_rotate("rope backward", dy, theta, offset, -1.0, dx);
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_ROPE_INSTANCES(EXTERN, T) \
  EXTERN template void rope_forward<T>(const Tensor<T>&, double, std::int64_t, const Tensor<T>&); \
  EXTERN template void rope_backward<T>(const Tensor<T>&, double, std::int64_t, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_ROPE_INSTANCES)

}  // namespace polyshard
