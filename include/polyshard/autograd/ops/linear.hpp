// Differentiable affine maps: linear(x, W, b) = x W^T + b, and batched matmul.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/accumulate.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/linear.hpp"
#include "polyshard/tensor/ops/matmul.hpp"

namespace polyshard {

namespace detail {
/// alpha and beta as the device's matmul_into takes them: T on the host, float on a GPU.
template <class T, class D>
auto gemm_scalar(int v) {  // 1 for alpha; 0 or 1 (accumulate) for beta
  if constexpr (std::same_as<D, Cpu>) return T(v);
  else return float(v);
}
}  // namespace detail

/// y = x W^T (+ b).  x: (..., in), weight: (out, in) as PyTorch stores it, bias: (out,) or
/// undefined. Returns (..., out).
template <FloatElement T, Device D>
Var<T, D> linear(const Var<T, D>& x, const Var<T, D>& weight, const Var<T, D>& bias = Var<T, D>()) {
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  POLYSHARD_CHECK(ws.rank() == 2 && xs.rank() >= 1 && xs.back() == ws[1], "linear: input of shape ", xs,
                  " does not fit weight of shape ", ws, " (expected last input dimension ", ws.rank() == 2 ? ws[1] : -1,
                  ")");
  if (bias.defined())
    POLYSHARD_CHECK(bias.shape() == Shape{ws[0]}, "linear: bias of shape ", bias.shape(),
                    " does not fit weight of shape ", ws);
  const Tensor<T, D> x2 = x.value().contiguous().reshape({-1, ws[1]});  // (R, in)
  Shape ys = xs;
  ys[ys.rank() - 1] = ws[0];
  Tensor<T, D> y = Tensor<T, D>::empty(ys);  // (..., out)
  linear_forward(x2, weight.value(), bias.defined() ? bias.value() : Tensor<T, D>(), y.reshape({-1, ws[0]}));

  auto backward = [x2, has_bias = bias.defined()](Node<T, D>& self) {
    const Tensor<T, D>& w = self.inputs[1]->value;              // (out, in)
    const Tensor<T, D> dy = self.grad.reshape({-1, w.size(0)});  // (R, out)
    GradOut<T, D> dx = detail::grad_out(self, 0);
    if (dx.wanted()) dx.tensor = dx.tensor.reshape({-1, w.size(1)});  // (R, in)
    linear_backward(x2, w, dy, dx, detail::grad_out(self, 1), has_bias ? detail::grad_out(self, 2) : GradOut<T, D>{});
  };
  Var<T, D> result = bias.defined() ? make_result(std::move(y), "linear", {x, weight, bias}, std::move(backward))
                                     : make_result(std::move(y), "linear", {x, weight}, std::move(backward));
  result.node()->value_is_scratch = true;  // the backward reads x, the weight and the gradient alone
  return result;
}

/// Batched product a b over the last two dimensions. a: (..., M, K); b: (K, N) shared by the
/// batch, or (..., K, N). Returns (..., M, N).
template <FloatElement T, Device D>
Var<T, D> matmul(const Var<T, D>& a, const Var<T, D>& b) {
  Tensor<T, D> y = matmul(a.value(), b.value());
  return make_result(std::move(y), "matmul", {a, b}, [](Node<T, D>& self) {
    const auto one = detail::gemm_scalar<T, D>(1);
    const auto beta = [](bool accumulate) { return detail::gemm_scalar<T, D>(accumulate); };
    const Tensor<T, D>& av = self.inputs[0]->value;
    const Tensor<T, D>& bv = self.inputs[1]->value;
    const Tensor<T, D>& dy = self.grad;  // (..., M, N)
    if (GradSink<T, D> da = self.inputs[0]->sink(); da.wanted())  // (..., M, K) = dy b^T
      matmul_into(dy, bv.transpose(), da.tensor, one, beta(da.accumulate));
    if (GradSink<T, D> db = self.inputs[1]->sink(); db.wanted()) {
      if (bv.rank() == 2) {  // (K, N) = sum over the batch of a^T dy
        const Tensor<T, D> a2 = av.contiguous().reshape({-1, av.size(-1)});
        matmul_into(a2.transpose(), dy.reshape({-1, dy.size(-1)}), db.tensor, one, beta(db.accumulate));
      } else {               // (..., K, N) = a^T dy per batch element
        matmul_into(av.transpose(), dy, db.tensor, one, beta(db.accumulate));
      }
    }
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_LINEAR_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> linear<T, Cpu>(const Var<T, Cpu>&, const Var<T, Cpu>&, const Var<T, Cpu>&); \
  EXTERN template Var<T, Cpu> matmul<T, Cpu>(const Var<T, Cpu>&, const Var<T, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_LINEAR_INSTANCES)

}  // namespace polyshard
