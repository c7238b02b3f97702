// Multi-head causal self-attention: one projection to q, k, v, attention, an output projection.
#pragma once

#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/kv_cache.hpp"
#include "polyshard/nn/linear.hpp"
#include "polyshard/nn/module_hooks.hpp"

namespace polyshard {

template <FloatElement T, Device D = Cpu>
struct CausalSelfAttention {
  BOOST_HANA_DEFINE_STRUCT(CausalSelfAttention, (Linear<T, D>, c_attn), (Linear<T, D>, c_proj));
  int n_head = 1;

  CausalSelfAttention() = default;
  CausalSelfAttention(std::int64_t dim, int heads, double proj_std)
      : c_attn(dim, 3 * dim), c_proj(dim, dim, proj_std), n_head(heads) {
    POLYSHARD_CHECK(heads >= 1 && dim % heads == 0, "CausalSelfAttention: width ", dim,
                    " is not divisible by the number of heads ", heads);
  }

  /// x: (B, T, C) -> (B, T, C).
  Var<T, D> operator()(const Var<T, D>& x) const {
    return call(c_proj, causal_self_attention(call(c_attn, x), n_head));  // qkv: (B, T, 3C)
  }

  /// x: (B, T, C) at positions cache.length() onwards -> (B, T, C), caching their keys and
  /// values in layer `layer` of `cache`. For generation (no backward); on the host.
  Var<T, D> forward_cached(const Var<T, D>& x, KvCache<T>& cache, std::size_t layer) const
    requires std::same_as<D, Cpu>
  {
    return call(c_proj, attend_cached(call(c_attn, x), cache, layer, n_head));
  }
};

}  // namespace polyshard
