// Helpers shared by the CPU kernels: contiguous runs as Eigen arrays, output checks, exp.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "polyshard/tensor/tensor.hpp"

namespace polyshard::detail {

/// A contiguous run of `n` elements as an Eigen array, so expressions get vectorized fused loops.
template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

template <class T>
ArrayMap<T> array_map(T* p, std::int64_t n) {
  return ArrayMap<T>(p, static_cast<Eigen::Index>(n));
}
template <class T>
ConstArrayMap<T> array_map(const T* p, std::int64_t n) {
  return ConstArrayMap<T>(p, static_cast<Eigen::Index>(n));
}

/// e^x for float, written so that GCC vectorizes a loop of it: Eigen's AVX-512 exp would do as
/// well, but GCC 12 warns falsely inside it (-Wuninitialized in avx512fintrin.h) in every user's
/// translation unit. Range reduction x = k ln2 + r, |r| <= ln2 / 2, then a degree-6 Taylor
/// polynomial (relative error below 1e-7, about 1 ulp); inputs below -87.3 give 0 (no
/// subnormals), above 88.7 about 3e38 instead of infinity.
inline float exp_float(float in) {
  const float x = std::min(std::max(in, -87.3f), 88.7f);
  const float k = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-6f;  // ln2 in two parts
  float p = 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const float e = p * std::bit_cast<float>((static_cast<std::int32_t>(k) + 127) << 23);
  return in < -87.3f ? 0.f : e;
}

/// y[i] = exp(x[i] - shift) * scale for i < n; y may be x. Double (only the gradient checks use
/// it) goes through std::exp.
template <class T>
void exp_shift_scale(const T* x, T shift, T scale, T* y, std::int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = exp_float(x[i] - shift) * scale;
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - shift) * scale;
  }
}

/// Elements per block of the kernels that stage exp values in a stack buffer (8 KiB of float).
inline constexpr std::int64_t exp_block = 2048;

/// Sum of an array expression as a double. Float sums run vectorized in blocks of 2048 whose
/// partial sums are added in double: as fast as a float sum (converting each element to double
/// would stop Eigen vectorizing the reduction) with an error bounded by the block length.
template <class Derived>
double sum(const Eigen::ArrayBase<Derived>& x) {
  using S = typename Derived::Scalar;
  if constexpr (std::is_same_v<S, double>) {
    return x.sum();
  } else {
    constexpr Eigen::Index block = 2048;
    const Eigen::Index n = x.size();
    if (n <= block) return double(x.template cast<float>().sum());
    double s = 0;
    for (Eigen::Index i = 0; i < n; i += block)
      s += double(x.segment(i, std::min(block, n - i)).template cast<float>().sum());
    return s;
  }
}

/// sum over i < n of exp(x[i] - shift), as a double, staged through a stack buffer.
template <class T>
double sum_exp_shift(const T* x, T shift, std::int64_t n) {
  alignas(64) T buf[exp_block];
  double s = 0;
  for (std::int64_t i = 0; i < n; i += exp_block) {
    const std::int64_t m = std::min(exp_block, n - i);
    exp_shift_scale(x + i, shift, T(1), buf, m);
    s += sum(array_map(static_cast<const T*>(buf), m));
  }
  return s;
}

/// Assigns `expr` to `dst`, or adds it when `accumulate`: the branch sits outside the loop.
template <class Dst, class Expr>
void assign_or_add(Dst&& dst, const Expr& expr, bool accumulate) {
  if (accumulate) dst += expr;
  else dst = expr;
}

/// Checks that a kernel's output is defined, contiguous, and of the shape the kernel writes.
template <class T, class D>
void check_output(const char* op, const char* what, const Tensor<T, D>& out, const Shape& expected) {
  POLYSHARD_CHECK(out.defined(), op, ": output ", what, " is undefined");
  check_same_shape(op, out.shape(), expected);
  POLYSHARD_CHECK(out.is_contiguous(), op, ": output ", what, " of shape ", out.shape(), " is not contiguous");
}

/// The 32- or 64-bit float types the CPU compute kernels run in.
template <class T>
inline constexpr bool is_compute_float_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

}  // namespace polyshard::detail
