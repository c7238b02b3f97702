// The transformer's feed-forward network: expand 4x, GELU, project back.
#pragma once

#include <concepts>

#include "polyshard/nn/gelu.hpp"
#include "polyshard/nn/linear.hpp"
#include "polyshard/nn/module_hooks.hpp"

namespace polyshard {

template <FloatElement T, Device D = Cpu>
struct Mlp {
  BOOST_HANA_DEFINE_STRUCT(Mlp, (Linear<T, D>, c_fc), (Gelu<T, D>, gelu), (Linear<T, D>, c_proj));

  Mlp() = default;
  /// `proj_std`: GPT-2 scales the residual projection's init by 1/sqrt(2 * layers).
  Mlp(std::int64_t dim, double proj_std) : c_fc(dim, 4 * dim), gelu{}, c_proj(4 * dim, dim, proj_std) {}

  /// x: (B, T, C) -> (B, T, C). On a GPU, one op (gelu_mlp) with fewer passes over the hidden
  /// activations, where no engine acts around the three children (they are not units of their
  /// own, nor checkpointed alone), unless POLYSHARD_FUSED_MLP=0.
  Var<T, D> operator()(const Var<T, D>& x) const {
    if constexpr (!std::same_as<D, Cpu>) {
      if (fused_mlp_enabled() && calls_are_plain<T, D>(c_fc, gelu, c_proj))
        return gelu_mlp(x, c_fc.weight.var(), c_fc.bias.var(), c_proj.weight.var(), c_proj.bias.var());
    }
    return call(c_proj, call(gelu, call(c_fc, x)));
  }
};

}  // namespace polyshard
