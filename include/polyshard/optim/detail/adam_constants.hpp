// Adam's per-step constants, shared by the host kernels (optim/adam.hpp) and the fused device
// kernels (optim/cuda/fused_optimizers.cu): plain C++ without Eigen, so nvcc compiles it too.
#pragma once

#include <cmath>
#include <cstdint>

#include "polyshard/optim/config.hpp"

namespace polyshard::detail {

// Per-step constants, computed once in double as PyTorch computes them in Python floats, then
// rounded to P as PyTorch rounds a Scalar to the tensor's type.
template <class P>
struct AdamConstants {
  P lerp_weight;          // 1 - beta1
  P lerp_weight_complement;  // 1 - (1 - beta1), for lerp's upper branch
  bool lerp_low;          // lerp's branch: |weight| < 0.5
  P beta2, one_minus_beta2;
  P coupled_decay;        // Adam: grad += wd * param
  P decoupled_scale;      // AdamW: param *= 1 - lr * wd
  P neg_step_size;        // -lr / (1 - beta1^step)
  P bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  P eps;
  P grad_scale;           // every gradient times this first: 1 / loss scale times a clipping coefficient
  bool coupled, decoupled;
};

template <class P>
AdamConstants<P> adam_constants(const AdamConfig& c, std::int64_t step, bool decoupled_weight_decay,
                                double grad_scale = 1.0) {
  const double s = static_cast<double>(step);
  const double bias_correction1 = 1 - std::pow(c.beta1, s);
  const double bias_correction2 = 1 - std::pow(c.beta2, s);
  AdamConstants<P> k{};
  k.lerp_weight = static_cast<P>(1 - c.beta1);
  k.lerp_weight_complement = P(1) - k.lerp_weight;
  k.lerp_low = std::abs(k.lerp_weight) < P(0.5);
  k.beta2 = static_cast<P>(c.beta2);
  k.one_minus_beta2 = static_cast<P>(1 - c.beta2);
  k.coupled = !decoupled_weight_decay && c.weight_decay != 0;
  k.decoupled = decoupled_weight_decay && c.weight_decay != 0;
  k.coupled_decay = static_cast<P>(c.weight_decay);
  k.decoupled_scale = static_cast<P>(1 - c.lr * c.weight_decay);
  k.neg_step_size = static_cast<P>(-(c.lr / bias_correction1));
  k.bias_correction2_sqrt = static_cast<P>(std::sqrt(bias_correction2));
  k.eps = static_cast<P>(c.eps);
  k.grad_scale = static_cast<P>(grad_scale);
  return k;
}

}  // namespace polyshard::detail
