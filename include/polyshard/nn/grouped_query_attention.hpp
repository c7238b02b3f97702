// Causal self-attention with rotary queries and keys and fewer key-value heads than query heads
// (grouped-query attention), as Hugging Face's LlamaAttention: bias-free projections under its
// names.
#pragma once

#include "polyshard/nn/kv_cache.hpp"
#include "polyshard/nn/linear_no_bias.hpp"
#include "polyshard/nn/module_hooks.hpp"

namespace polyshard {

/// q_proj: (n_head head_dim, dim); k_proj, v_proj: (n_kv_head head_dim, dim); o_proj:
/// (dim, n_head head_dim); head_dim = dim / n_head. n_kv_head = n_head is multi-head attention,
/// n_kv_head = 1 multi-query attention.
template <FloatElement T, Device D = Cpu>
struct GroupedQueryAttention {
  BOOST_HANA_DEFINE_STRUCT(GroupedQueryAttention, (LinearNoBias<T, D>, q_proj), (LinearNoBias<T, D>, k_proj),
                           (LinearNoBias<T, D>, v_proj), (LinearNoBias<T, D>, o_proj));
  int n_head = 1;
  int n_kv_head = 1;
  double rope_theta = 10000.0;

  GroupedQueryAttention() = default;
  /// `o_std`: the residual projection's init, often scaled by 1/sqrt(2 * layers).
  GroupedQueryAttention(std::int64_t dim, int heads, int kv_heads, double theta = 10000.0, double std = 0.02,
                        double o_std = 0.02)
      : q_proj(dim, dim, std),
        k_proj(dim, checked_head_dim(dim, heads, kv_heads) * kv_heads, std),
        v_proj(dim, dim / heads * kv_heads, std),
        o_proj(dim, dim, o_std),
        n_head(heads),
        n_kv_head(kv_heads),
        rope_theta(theta) {}

  /// x: (B, T, dim) -> (B, T, dim); positions 0 to T - 1.
  Var<T, D> operator()(const Var<T, D>& x) const {
    POLYSHARD_CHECK(x.shape().rank() == 3, "GroupedQueryAttention: input must be (B, T, dim), got shape ", x.shape());
    return call(o_proj, grouped_causal_self_attention(rotated(q_proj, x, n_head, 0), rotated(k_proj, x, n_kv_head, 0),
                                                      call(v_proj, x), n_head, n_kv_head));
  }

  /// x: (B, T, dim) at positions cache.length() onwards -> (B, T, dim), caching their rotated
  /// keys and their values (n_kv_head heads, not repeated) in layer `layer` of `cache`. For
  /// generation (no backward); on the host.
  Var<T, D> forward_cached(const Var<T, D>& x, KvCache<T>& cache, std::size_t layer) const
    requires std::same_as<D, Cpu>
  {
    POLYSHARD_CHECK(x.shape().rank() == 3, "GroupedQueryAttention: input must be (B, T, dim), got shape ", x.shape());
    const std::int64_t past = cache.length();
    return call(o_proj, attend_cached(rotated(q_proj, x, n_head, past), rotated(k_proj, x, n_kv_head, past),
                                      call(v_proj, x), cache, layer, n_head, n_kv_head));
  }

  /// Width of one position's cached keys: n_kv_head head_dim.
  std::int64_t kv_width() const { return k_proj.weight.shape()[0]; }

 private:
  /// proj(x) (B, T, heads head_dim) with each head rotated at positions offset onwards.
  Var<T, D> rotated(const LinearNoBias<T, D>& proj, const Var<T, D>& x, int heads, std::int64_t offset) const {
    const std::int64_t b = x.shape()[0], t = x.shape()[1], hd = x.shape()[2] / n_head;
    return reshape(rope(reshape(call(proj, x), {b, t, heads, hd}), rope_theta, offset), {b, t, heads * hd});
  }
  static std::int64_t checked_head_dim(std::int64_t dim, int heads, int kv_heads) {
    POLYSHARD_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "GroupedQueryAttention: n_head (", heads,
                    ") must be a positive multiple of n_kv_head (", kv_heads, ")");
    POLYSHARD_CHECK(dim > 0 && dim % heads == 0, "GroupedQueryAttention: dim ", dim, " is not a multiple of n_head ",
                    heads);
    return dim / heads;
  }
};

}  // namespace polyshard
