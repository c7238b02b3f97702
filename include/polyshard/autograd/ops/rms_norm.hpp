// Differentiable root-mean-square normalization over the last dimension (torch.nn.RMSNorm).
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/rms_norm.hpp"

namespace polyshard {

/// x / sqrt(mean(x^2) + eps) * weight over the last dimension, as torch.nn.functional.rms_norm
/// (eps inside the square root; torch's default eps is the input type's machine epsilon, which
/// nn::RMSNorm passes). x: (..., C); weight: (C,). Returns (..., C). Saves the rows' reciprocal
/// root mean squares, (...), besides its inputs.
template <FloatElement T, Device D>
Var<T, D> rms_norm(const Var<T, D>& x, const Var<T, D>& weight, double eps) {
  const Shape& xs = x.shape();
  POLYSHARD_CHECK(xs.rank() >= 1, "rms_norm: input needs at least 1 dimension, got shape ", xs);
  Shape stats;
  for (int i = 0; i < xs.rank() - 1; ++i) stats.push_back(xs[i]);
  Tensor<T, D> y = Tensor<T, D>::empty(xs);  // (..., C)
  using S = detail::stats_t<T, D>;
  Tensor<S, D> rstd = Tensor<S, D>::empty(stats);  // (...)
  rms_norm_forward(x.value(), weight.value(), eps, y, rstd);
  return make_result(std::move(y), "rms_norm", {x, weight}, [rstd](Node<T, D>& self) {
    rms_norm_backward(self.inputs[0]->value, self.inputs[1]->value, rstd, self.grad, detail::grad_out(self, 0),
                      detail::grad_out(self, 1));
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_RMS_NORM_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> rms_norm<T, Cpu>(const Var<T, Cpu>&, const Var<T, Cpu>&, double);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_RMS_NORM_INSTANCES)

}  // namespace polyshard
