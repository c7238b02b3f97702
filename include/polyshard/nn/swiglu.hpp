// The SwiGLU feed-forward network of Llama-style models: down(silu(gate(x)) * up(x)), with
// bias-free projections named as Hugging Face's LlamaMLP names them.
#pragma once

#include "polyshard/nn/linear_no_bias.hpp"
#include "polyshard/nn/module_hooks.hpp"

namespace polyshard {

/// gate_proj, up_proj: (hidden, dim); down_proj: (dim, hidden) (Meta's w1, w3 and w2).
template <FloatElement T, Device D = Cpu>
struct SwiGlu {
  BOOST_HANA_DEFINE_STRUCT(SwiGlu, (LinearNoBias<T, D>, gate_proj), (LinearNoBias<T, D>, up_proj),
                           (LinearNoBias<T, D>, down_proj));

  SwiGlu() = default;
  /// `down_std`: the residual projection's init, often scaled by 1/sqrt(2 * layers).
  SwiGlu(std::int64_t dim, std::int64_t hidden, double std = 0.02, double down_std = 0.02)
      : gate_proj(dim, hidden, std), up_proj(dim, hidden, std), down_proj(hidden, dim, down_std) {}

  /// x: (..., dim) -> (..., dim). The projections go through call(), so a wrap policy may make
  /// them units.
  Var<T, D> operator()(const Var<T, D>& x) const {
    return call(down_proj, mul(silu(call(gate_proj, x)), call(up_proj, x)));
  }
};

}  // namespace polyshard
