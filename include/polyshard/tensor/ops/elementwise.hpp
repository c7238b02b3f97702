// Elementwise arithmetic (add, mul, scale) over tensors of one shape; the 16-bit storage types
// compute in float.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

/// out = a + b, elementwise. a, b, out: one shape (any); out contiguous and may alias a or b.
/// half and bfloat16 are converted to float, added, and rounded back.
template <FloatElement T>
void add_into(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& out) {
  check_same_shape("add", a.shape(), b.shape());
  detail::check_output("add", "out", out, a.shape());
  using C = compute_t<T>;
  const Tensor<T> ac = a.contiguous(), bc = b.contiguous();
  const std::int64_t n = out.numel();
  detail::array_map(out.data(), n) = (detail::array_map(ac.data(), n).template cast<C>() +
                                      detail::array_map(bc.data(), n).template cast<C>())
                                         .template cast<T>();
}

/// a + b as a new tensor. a, b: one shape; returns that shape.
template <FloatElement T>
Tensor<T> add(const Tensor<T>& a, const Tensor<T>& b) {
  check_same_shape("add", a.shape(), b.shape());
  Tensor<T> out = Tensor<T>::empty(a.shape());
  add_into(a, b, out);
  return out;
}

/// out = a * b, elementwise. a, b, out: one shape; out contiguous and may alias a or b.
template <FloatElement T>
void mul_into(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& out) {
  check_same_shape("mul", a.shape(), b.shape());
  detail::check_output("mul", "out", out, a.shape());
  using C = compute_t<T>;
  const Tensor<T> ac = a.contiguous(), bc = b.contiguous();
  const std::int64_t n = out.numel();
  detail::array_map(out.data(), n) = (detail::array_map(ac.data(), n).template cast<C>() *
                                      detail::array_map(bc.data(), n).template cast<C>())
                                         .template cast<T>();
}

/// a * b as a new tensor. a, b: one shape; returns that shape.
template <FloatElement T>
Tensor<T> mul(const Tensor<T>& a, const Tensor<T>& b) {
  check_same_shape("mul", a.shape(), b.shape());
  Tensor<T> out = Tensor<T>::empty(a.shape());
  mul_into(a, b, out);
  return out;
}

/// out = s * x, elementwise, s rounded to x's compute type. x, out: one shape; out may alias x.
template <FloatElement T>
void scale_into(const Tensor<T>& x, double s, const Tensor<T>& out) {
  detail::check_output("scale", "out", out, x.shape());
  using C = compute_t<T>;
  const Tensor<T> xc = x.contiguous();
  const std::int64_t n = out.numel();
  detail::array_map(out.data(), n) =
      (detail::array_map(xc.data(), n).template cast<C>() * static_cast<C>(s)).template cast<T>();
}

/// s * x as a new tensor of x's shape.
template <FloatElement T>
Tensor<T> scale(const Tensor<T>& x, double s) {
  Tensor<T> out = Tensor<T>::empty(x.shape());
  scale_into(x, s, out);
  return out;
}

/// y += s * x, elementwise (in place on y). x, y: one shape; y contiguous.
template <FloatElement T>
void add_scaled_into(const Tensor<T>& x, double s, const Tensor<T>& y) {
  detail::check_output("add_scaled", "y", y, x.shape());
  using C = compute_t<T>;
  const Tensor<T> xc = x.contiguous();
  const std::int64_t n = y.numel();
  auto ym = detail::array_map(y.data(), n);
  ym = (ym.template cast<C>() + detail::array_map(xc.data(), n).template cast<C>() * static_cast<C>(s))
           .template cast<T>();
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_ELEMENTWISE_INSTANCES(EXTERN, T) \
  EXTERN template void add_into<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&); \
  EXTERN template Tensor<T> add<T>(const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void mul_into<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&); \
  EXTERN template Tensor<T> mul<T>(const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void scale_into<T>(const Tensor<T>&, double, const Tensor<T>&); \
  EXTERN template Tensor<T> scale<T>(const Tensor<T>&, double); \
  EXTERN template void add_scaled_into<T>(const Tensor<T>&, double, const Tensor<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_ELEMENTWISE_INSTANCES)

}  // namespace polyshard
