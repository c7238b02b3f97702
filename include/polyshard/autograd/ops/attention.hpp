// Differentiable causal self-attention: multi-head over GPT-2's fused qkv projection, and
// grouped-query over separate q, k and v projections (Llama's).
#pragma once

#include <type_traits>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/autograd/ops/grouped_qkv.hpp"
#include "polyshard/tensor/ops/attention.hpp"

namespace polyshard {

/// Concat over heads of softmax(q k^T / sqrt(head_dim), causal mask) v.
/// qkv: (B, T, 3C) laid out [q | k | v] along the last dimension, each C = n_head * head_dim
/// with heads contiguous inside (GPT-2's c_attn output); returns (B, T, C). Saves the attention
/// probabilities, (B, n_head, T, T), besides its input; on a GPU, 16-bit attention with a head
/// dimension the fused kernels take saves the output and (B, n_head, T) row statistics instead.
template <FloatElement T, Device D>
Var<T, D> causal_self_attention(const Var<T, D>& qkv, int n_head) {
  const auto [nb, nt, c, hd] = detail::attention_dims("causal_self_attention", qkv.value(), n_head);
  Tensor<T, D> y = Tensor<T, D>::empty({nb, nt, c});  // (B, T, C)
  if constexpr (std::is_same_v<D, Cuda> && sizeof(T) == 2) {
    // On a GPU, 16-bit attention runs fused (tensor/cuda/flash_attention.hpp): it saves its
    // output and each row's log-sum-exp, (B, n_head, T) floats, instead of the probabilities.
    // (Decided at compile time, not only by fused_attention_applies: the kernels exist for the
    // 16-bit types alone, and an unoptimized build links every call it sees.)
    if (fused_attention_applies(qkv.value(), n_head)) {
      Tensor<float, D> lse = Tensor<float, D>::empty({nb, n_head, nt});
      causal_self_attention_fused_forward(qkv.value(), n_head, y, lse);
      return make_result(std::move(y), "causal_self_attention", {qkv}, [lse, n_head](Node<T, D>& self) {
        causal_self_attention_fused_backward(self.inputs[0]->value, self.value, lse, self.grad, n_head,
                                             detail::grad_out(self, 0));
      });
    }
  }
  Tensor<T, D> att = Tensor<T, D>::empty({nb, n_head, nt, nt});  // (B, n_head, T, T)
  causal_self_attention_forward(qkv.value(), n_head, y, att);
  return make_result(std::move(y), "causal_self_attention", {qkv}, [att, n_head](Node<T, D>& self) {
    causal_self_attention_backward(self.inputs[0]->value, att, self.grad, n_head, detail::grad_out(self, 0));
  });
}

/// Grouped-query causal attention over separate projections: q (B, T, n_head D), k and v
/// (B, T, n_kv_head D), query head j reading key-value head j / (n_head / n_kv_head) (n_kv_head
/// = n_head is multi-head attention); returns (B, T, n_head D). On a GPU, 16-bit attention that
/// the fused kernels compute reads the key-value heads in place, without repeating them, and
/// saves the output and (B, n_head, T) row statistics; elsewhere the key-value heads are
/// repeated into GPT-2's fused layout (grouped_qkv) for causal_self_attention.
template <FloatElement T, Device D>
Var<T, D> grouped_causal_self_attention(const Var<T, D>& q, const Var<T, D>& k, const Var<T, D>& v, int n_head,
                                        int n_kv_head) {
  if constexpr (std::is_same_v<D, Cuda> && sizeof(T) == 2) {
    // Three distinct inputs: the backward writes each gradient through a slot of its own.
    const bool distinct = q.node() != k.node() && q.node() != v.node() && k.node() != v.node();
    if (distinct && grouped_fused_attention_applies(q.value(), k.value(), v.value(), n_head, n_kv_head)) {
      Tensor<T, D> y = Tensor<T, D>::empty(q.shape());
      Tensor<float, D> lse = Tensor<float, D>::empty({q.shape()[0], n_head, q.shape()[1]});
      grouped_attention_fused_forward(q.value(), k.value(), v.value(), n_head, n_kv_head, y, lse);
      return make_result(std::move(y), "grouped_causal_self_attention", {q, k, v},
                         [lse, n_head, n_kv_head](Node<T, D>& self) {
                           grouped_attention_fused_backward(
                               self.inputs[0]->value, self.inputs[1]->value, self.inputs[2]->value, self.value, lse,
                               self.grad, n_head, n_kv_head, detail::grad_out(self, 0), detail::grad_out(self, 1),
                               detail::grad_out(self, 2));
                         });
    }
  }
  return causal_self_attention(grouped_qkv(q, k, v, n_head, n_kv_head), n_head);
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_ATTENTION_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> causal_self_attention<T, Cpu>(const Var<T, Cpu>&, int);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_ATTENTION_INSTANCES)

}  // namespace polyshard
