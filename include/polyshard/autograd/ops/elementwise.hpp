// Differentiable elementwise arithmetic: add (and operator+), mul, scale.
#pragma once

#include "polyshard/autograd/ops/accumulate.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/elementwise.hpp"

namespace polyshard {

/// a + b, elementwise. a, b: one shape (no broadcasting); returns that shape.
template <FloatElement T>
Var<T> add(const Var<T>& a, const Var<T>& b) {
  Tensor<T> y = add(a.value(), b.value());
  return make_result(std::move(y), "add", {a, b}, [](Node<T>& self) {
    accumulate_into(self.inputs[0]->sink(), self.grad);
    accumulate_into(self.inputs[1]->sink(), self.grad);
  });
}

/// a + b, elementwise (see add).
template <FloatElement T>
Var<T> operator+(const Var<T>& a, const Var<T>& b) {
  return add(a, b);
}

/// a * b, elementwise. a, b: one shape (no broadcasting); returns that shape.
template <FloatElement T>
Var<T> mul(const Var<T>& a, const Var<T>& b) {
  Tensor<T> y = mul(a.value(), b.value());
  return make_result(std::move(y), "mul", {a, b}, [](Node<T>& self) {
    const Tensor<T>& av = self.inputs[0]->value;
    const Tensor<T>& bv = self.inputs[1]->value;
    // d/da = g b, d/db = g a; the inputs' values are the saved activations.
    if (GradOut<T> da = detail::grad_out(self, 0); da.wanted()) {
      if (da.accumulate) add_into(da.tensor, mul(self.grad, bv), da.tensor);
      else mul_into(self.grad, bv, da.tensor);
    }
    if (GradOut<T> db = detail::grad_out(self, 1); db.wanted()) {
      if (db.accumulate) add_into(db.tensor, mul(self.grad, av), db.tensor);
      else mul_into(self.grad, av, db.tensor);
    }
  });
}

/// s * x, elementwise. x: any shape; returns that shape.
template <FloatElement T>
Var<T> scale(const Var<T>& x, double s) {
  Tensor<T> y = scale(x.value(), s);
  return make_result(std::move(y), "scale", {x}, [s](Node<T>& self) {
    if (GradOut<T> dx = detail::grad_out(self, 0); dx.wanted()) {
      if (dx.accumulate) add_scaled_into(self.grad, s, dx.tensor);
      else scale_into(self.grad, s, dx.tensor);
    }
  });
}

}  // namespace polyshard
