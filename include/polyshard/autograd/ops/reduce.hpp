// Differentiable whole-tensor reductions to a scalar: sum and mean.
#pragma once

#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/reduce.hpp"

namespace polyshard {

namespace detail {
/// dx (+)= g everywhere: the gradient of a sum scaled by `factor`.
template <FloatElement T>
void broadcast_scalar_grad(const GradOut<T>& dx, T g) {
  if (!dx.wanted()) return;
  auto d = array_map(dx.tensor.data(), dx.tensor.numel());
  if (dx.accumulate) d += g;
  else d.setConstant(g);
}
}  // namespace detail

/// Sum of all elements (accumulated in blocks added in double). x: any shape; returns a scalar (shape ()).
template <FloatElement T>
Var<T> sum(const Var<T>& x) {
  Tensor<T> y = Tensor<T>::full(Shape{}, T(sum(x.value())));  // ()
  return make_result(std::move(y), "sum", {x}, [](Node<T>& self) {
    detail::broadcast_scalar_grad(detail::grad_out(self, 0), self.grad.data()[0]);
  });
}

/// Mean of all elements (accumulated in blocks added in double). x: any shape with at least one element;
/// returns a scalar (shape ()).
template <FloatElement T>
Var<T> mean(const Var<T>& x) {
  Tensor<T> y = Tensor<T>::full(Shape{}, T(mean(x.value())));  // ()
  const double inv_n = 1.0 / double(x.value().numel());
  return make_result(std::move(y), "mean", {x}, [inv_n](Node<T>& self) {
    detail::broadcast_scalar_grad(detail::grad_out(self, 0), T(double(self.grad.data()[0]) * inv_n));
  });
}

}  // namespace polyshard
