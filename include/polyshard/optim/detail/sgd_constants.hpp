// SGD's per-step constants, shared by the portable and the x86 vector kernels (optim/sgd.hpp,
// optim/detail/x86_vectors.hpp): each rounded to P once, as PyTorch rounds a Scalar.
#pragma once

#include <cstdint>

#include "polyshard/optim/config.hpp"

namespace polyshard::detail {

template <class P>
struct SgdConstants {
  bool decay;       // weight_decay != 0: grad += wd * param
  bool first_step;  // the momentum buffer starts as a copy of the gradient
  bool nesterov;
  P weight_decay, momentum, one_minus_dampening, neg_lr;
  P grad_scale;  // every gradient times this first: 1 / loss scale times a clipping coefficient
};

template <class P>
SgdConstants<P> sgd_constants(const SgdConfig& c, std::int64_t step, double grad_scale = 1.0) {
  return {c.weight_decay != 0,           step == 1,
          c.nesterov,                    static_cast<P>(c.weight_decay),
          static_cast<P>(c.momentum),    static_cast<P>(1 - c.dampening),
          static_cast<P>(-c.lr),         static_cast<P>(grad_scale)};
}

}  // namespace polyshard::detail
