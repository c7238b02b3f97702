// A pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
#pragma once

#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/causal_self_attention.hpp"
#include "polyshard/nn/layer_norm.hpp"
#include "polyshard/nn/mlp.hpp"

namespace polyshard {

template <FloatElement T, Device D = Cpu>
struct Block {
  BOOST_HANA_DEFINE_STRUCT(Block, (LayerNorm<T, D>, ln_1), (CausalSelfAttention<T, D>, attn), (LayerNorm<T, D>, ln_2),
                           (Mlp<T, D>, mlp));

  Block() = default;
  Block(std::int64_t dim, int heads, double proj_std)
      : ln_1(dim), attn(dim, heads, proj_std), ln_2(dim), mlp(dim, proj_std) {}

  /// x: (B, T, C) -> (B, T, C).
  Var<T, D> operator()(const Var<T, D>& x) const {
    const Var<T, D> h = add(x, call(attn, call(ln_1, x)));
    return add(h, call(mlp, call(ln_2, h)));
  }

  /// The same at positions cache.length() onwards, caching the attention's keys and values in
  /// layer `layer` of `cache` (CausalSelfAttention::forward_cached).
  Var<T, D> forward_cached(const Var<T, D>& x, KvCache<T>& cache, std::size_t layer) const
    requires std::same_as<D, Cpu>
  {
    const auto cached = [&](const Var<T, D>& in) { return attn.forward_cached(in, cache, layer); };
    const Var<T, D> h = add(x, call_as(attn, call(ln_1, x), cached));
    return add(h, call(mlp, call(ln_2, h)));
  }
};

}  // namespace polyshard
