// Differentiable elementwise arithmetic: add (and operator+), mul, scale.
#pragma once

#include <utility>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/accumulate.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/elementwise.hpp"

namespace polyshard {

namespace detail {
/// The gradient of a + b: the sum's gradient, to each operand.
template <FloatElement T, Device D>
void add_backward(Node<T, D>& self) {
  accumulate_into(self.inputs[0]->sink(), self.grad);
  accumulate_into(self.inputs[1]->sink(), self.grad);
}
}  // namespace detail

/// a + b, elementwise. a, b: one shape (no broadcasting); returns that shape.
template <FloatElement T, Device D>
Var<T, D> add(const Var<T, D>& a, const Var<T, D>& b) {
  Tensor<T, D> y = add(a.value(), b.value());
  return make_result(std::move(y), "add", {a, b}, detail::add_backward<T, D>);
}

/// a + b, where the caller gives b up (a temporary, or std::move(b), which leaves b empty).
/// When b is scratch (a projection's output that nothing else holds: detail::scratch_for), the
/// sum is written over b's value instead of into a new tensor: the residual stream's
/// `add(x, call(attn, ...))` keeps one tensor alive where it kept two. The backward reads
/// neither operand, so nothing reads b's old value again.
template <FloatElement T, Device D>
Var<T, D> add(const Var<T, D>& a, Var<T, D>&& b) {
  if (&a == &b) return add(a, std::as_const(b));  // add(v, std::move(v)): v is still read as a
  const Var<T, D> given = std::move(b);
  Tensor<T, D> y = detail::scratch_for(given, a.shape());
  if (y.defined()) add_into(a.value(), given.value(), y);
  else y = add(a.value(), given.value());
  return make_result(std::move(y), "add", {a, given}, detail::add_backward<T, D>);
}

/// a + b, elementwise (see add).
template <FloatElement T, Device D>
Var<T, D> operator+(const Var<T, D>& a, const Var<T, D>& b) {
  return add(a, b);
}

/// a * b, elementwise. a, b: one shape (no broadcasting); returns that shape.
template <FloatElement T, Device D>
Var<T, D> mul(const Var<T, D>& a, const Var<T, D>& b) {
  Tensor<T, D> y = mul(a.value(), b.value());
  return make_result(std::move(y), "mul", {a, b}, [](Node<T, D>& self) {
    const Tensor<T, D>& av = self.inputs[0]->value;
    const Tensor<T, D>& bv = self.inputs[1]->value;
    // d/da = g b, d/db = g a; the inputs' values are the saved activations.
    if (GradOut<T, D> da = detail::grad_out(self, 0); da.wanted()) {
      if (da.accumulate) add_into(da.tensor, mul(self.grad, bv), da.tensor);
      else mul_into(self.grad, bv, da.tensor);
    }
    if (GradOut<T, D> db = detail::grad_out(self, 1); db.wanted()) {
      if (db.accumulate) add_into(db.tensor, mul(self.grad, av), db.tensor);
      else mul_into(self.grad, av, db.tensor);
    }
  });
}

/// s * x, elementwise. x: any shape; returns that shape.
template <FloatElement T, Device D>
Var<T, D> scale(const Var<T, D>& x, double s) {
  Tensor<T, D> y = scale(x.value(), s);
  return make_result(std::move(y), "scale", {x}, [s](Node<T, D>& self) {
    if (GradOut<T, D> dx = detail::grad_out(self, 0); dx.wanted()) {
      if (dx.accumulate) add_scaled_into(self.grad, s, dx.tensor);
      else scale_into(self.grad, s, dx.tensor);
    }
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_ELEMENTWISE_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> add<T, Cpu>(const Var<T, Cpu>&, const Var<T, Cpu>&); \
  EXTERN template Var<T, Cpu> mul<T, Cpu>(const Var<T, Cpu>&, const Var<T, Cpu>&); \
  EXTERN template Var<T, Cpu> scale<T, Cpu>(const Var<T, Cpu>&, double);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_ELEMENTWISE_INSTANCES)

}  // namespace polyshard
