// Differentiable whole-tensor reductions to a scalar: sum and mean.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/reduce.hpp"

namespace polyshard {

namespace detail {
/// dx (+)= g everywhere: the gradient of a sum scaled by `factor`.
template <FloatElement T, Device D>
void broadcast_scalar_grad(const GradOut<T, D>& dx, T g) {
  if (!dx.wanted()) return;
  if constexpr (std::same_as<D, Cpu>) {
    auto d = array_map(dx.tensor.data(), dx.tensor.numel());
    if (dx.accumulate) d += g;
    else d.setConstant(g);
  } else if (dx.accumulate) {
    add_into(dx.tensor, Tensor<T, D>::full(dx.tensor.shape(), g), dx.tensor);
  } else {
    dx.tensor.fill(g);
  }
}
}  // namespace detail

/// Sum of all elements (accumulated in blocks added in double). x: any shape; returns a scalar (shape ()).
template <FloatElement T, Device D>
Var<T, D> sum(const Var<T, D>& x) {
  Tensor<T, D> y = Tensor<T, D>::full(Shape{}, T(sum(x.value())));  // ()
  return detail::reads_scalar_grad(make_result(std::move(y), "sum", {x}, [](Node<T, D>& self) {
    detail::broadcast_scalar_grad(detail::grad_out(self, 0), T(detail::scalar_grad(self)));
  }));
}

/// Mean of all elements (accumulated in blocks added in double). x: any shape with at least one element;
/// returns a scalar (shape ()).
template <FloatElement T, Device D>
Var<T, D> mean(const Var<T, D>& x) {
  Tensor<T, D> y = Tensor<T, D>::full(Shape{}, T(mean(x.value())));  // ()
  const double inv_n = 1.0 / double(x.value().numel());
  return detail::reads_scalar_grad(make_result(std::move(y), "mean", {x}, [inv_n](Node<T, D>& self) {
    detail::broadcast_scalar_grad(detail::grad_out(self, 0), T(detail::scalar_grad(self) * inv_n));
  }));
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_REDUCE_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> sum<T, Cpu>(const Var<T, Cpu>&); \
  EXTERN template Var<T, Cpu> mean<T, Cpu>(const Var<T, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_REDUCE_INSTANCES)

}  // namespace polyshard
