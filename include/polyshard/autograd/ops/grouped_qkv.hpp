// Differentiable grouped-query key-value sharing: separate q, k and v projections into the fused
// layout causal_self_attention takes, each key-value head repeated for its group of query heads.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/grouped_qkv.hpp"

namespace polyshard {

/// [q | repeat(k) | repeat(v)] along the last dimension, query head j reading key-value head
/// j / (n_head / n_kv_head) (Hugging Face's repeat_kv). q: (B, T, n_head head_dim); k, v:
/// (B, T, n_kv_head head_dim). Returns (B, T, 3 n_head head_dim), for
/// causal_self_attention(qkv, n_head). Saves nothing.
template <FloatElement T, Device D>
Var<T, D> grouped_qkv(const Var<T, D>& q, const Var<T, D>& k, const Var<T, D>& v, int n_head, int n_kv_head) {
  const auto d = detail::grouped_qkv_dims("grouped_qkv", q.value(), k.value(), v.value(), n_head, n_kv_head);
  Tensor<T, D> qkv = Tensor<T, D>::empty({d.b, d.t, 3 * d.n_head * d.head_dim});  // (B, T, 3C)
  grouped_qkv_forward(q.value(), k.value(), v.value(), n_head, n_kv_head, qkv);
  return make_result(std::move(qkv), "grouped_qkv", {q, k, v}, [n_head, n_kv_head](Node<T, D>& self) {
    // One input's gradient at a time: claiming an input's slot marks it as holding a gradient,
    // so the same Var passed as k and v gets the second sum added to the first.
    for (std::size_t i = 0; i < 3; ++i) {
      GradOut<T, D> out[3];
      out[i] = detail::grad_out(self, i);
      if (out[i].wanted()) grouped_qkv_backward(self.grad, n_head, n_kv_head, out[0], out[1], out[2]);
    }
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_GROUPED_QKV_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> grouped_qkv<T, Cpu>(const Var<T, Cpu>&, const Var<T, Cpu>&, const Var<T, Cpu>&, int, int);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_GROUPED_QKV_INSTANCES)

}  // namespace polyshard
