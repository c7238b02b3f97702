// Causal multi-head self-attention over a fused qkv tensor (GPT-2's c_attn output): forward and
// backward kernels built from per-head GEMMs on strided views.
#pragma once

#include <algorithm>
#include <cmath>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"
#include "polyshard/tensor/ops/matmul.hpp"

namespace polyshard {

namespace detail {
/// Rows per block of the causal GEMMs: row block [i0, i1) only sees keys [0, i1), so the
/// products skip most of the masked upper triangle. 64 keeps each GEMM big enough for BLAS.
inline constexpr std::int64_t attention_block = 64;

struct AttentionDims {
  std::int64_t b, t, c, hd;
};

template <class T, class D>
AttentionDims attention_dims(const char* op, const Tensor<T, D>& qkv, int n_head) {
  POLYSHARD_CHECK(qkv.rank() == 3, op, ": qkv must be (B, T, 3C), got shape ", qkv.shape());
  POLYSHARD_CHECK(n_head > 0, op, ": n_head must be positive, got ", n_head);
  const std::int64_t c3 = qkv.size(2);
  POLYSHARD_CHECK(c3 % (3 * std::int64_t(n_head)) == 0 && c3 > 0, op, ": last dimension of qkv ", qkv.shape(),
                  " is not 3 * n_head * head_dim for n_head = ", n_head);
  return {qkv.size(0), qkv.size(1), c3 / 3, c3 / 3 / n_head};
}
}  // namespace detail

/// out = concat over heads of softmax(q k^T / sqrt(head_dim), causal mask) v.
/// qkv: (B, T, 3C) laid out [q | k | v] along the last dimension, each C = n_head * head_dim
/// with heads contiguous inside; out: (B, T, C); att: (B, n_head, T, T) receives the attention
/// probabilities (zero above the diagonal), which are all the backward pass needs besides qkv.
template <FloatElement T>
void causal_self_attention_forward(const Tensor<T>& qkv, int n_head, const Tensor<T>& out, const Tensor<T>& att) {
  static_assert(detail::is_compute_float_v<T>,
                "attention computes in float or double: cast half and bfloat16 tensors to float first");
  const auto [nb, nt, c, hd] = detail::attention_dims("causal_self_attention", qkv, n_head);
  detail::check_output("causal_self_attention", "out", out, Shape{nb, nt, c});
  detail::check_output("causal_self_attention", "att", att, Shape{nb, n_head, nt, nt});
  const Tensor<T> x = qkv.contiguous();  // (B, T, 3C)
  const std::int64_t ld = 3 * c;
  const T scale = T(1.0 / std::sqrt(double(hd)));
  for (std::int64_t b = 0; b < nb; ++b) {
    for (std::int64_t h = 0; h < n_head; ++h) {
      const T* q = x.data() + b * nt * ld + h * hd;  // (T, hd), row stride 3C
      const T* k = q + c;
      const T* v = q + 2 * c;
      T* p = att.data() + (b * n_head + h) * nt * nt;  // (T, T)
      T* o = out.data() + b * nt * c + h * hd;          // (T, hd), row stride C
      for (std::int64_t i0 = 0; i0 < nt; i0 += detail::attention_block) {
        const std::int64_t i1 = std::min(nt, i0 + detail::attention_block);
        // Scores of queries [i0, i1) against keys [0, i1).
        detail::gemm_2d(false, true, i1 - i0, i1, hd, scale, q + i0 * ld, ld, k, ld, T(0), p + i0 * nt, nt);
        for (std::int64_t i = i0; i < i1; ++i) {
          auto row = detail::array_map(p + i * nt, i + 1);  // (i + 1,) visible keys
          const T m = row.maxCoeff();
          detail::exp_shift_scale(row.data(), m, T(1), row.data(), i + 1);
          row *= T(1.0 / detail::sum(row));
          std::fill(p + i * nt + i + 1, p + (i + 1) * nt, T(0));
        }
        detail::gemm_2d(false, false, i1 - i0, hd, i1, T(1), p + i0 * nt, nt, v, ld, T(0), o + i0 * c, c);
      }
    }
  }
}

/// Gradient of causal_self_attention_forward with respect to qkv, from the saved probabilities.
/// qkv: (B, T, 3C); att: (B, n_head, T, T) from the forward pass; dout: (B, T, C);
/// dqkv: (B, T, 3C), written (or added to) in its q, k and v parts.
template <FloatElement T>
void causal_self_attention_backward(const Tensor<T>& qkv, const Tensor<T>& att, const Tensor<T>& dout, int n_head,
                                    const GradOut<T>& dqkv) {
  static_assert(detail::is_compute_float_v<T>,
                "attention computes in float or double: cast half and bfloat16 tensors to float first");
  if (!dqkv.wanted()) return;
  const auto [nb, nt, c, hd] = detail::attention_dims("causal_self_attention backward", qkv, n_head);
  check_same_shape("causal_self_attention backward", att.shape(), Shape{nb, n_head, nt, nt});
  check_same_shape("causal_self_attention backward", dout.shape(), Shape{nb, nt, c});
  detail::check_output("causal_self_attention backward", "dqkv", dqkv.tensor, qkv.shape());
  const Tensor<T> x = qkv.contiguous(), pc = att.contiguous(), gc = dout.contiguous();
  const std::int64_t ld = 3 * c;
  const T scale = T(1.0 / std::sqrt(double(hd)));
  const T beta = dqkv.accumulate ? T(1) : T(0);
  // Gradient of the scores of one head; reused across heads. Entries right of each row block's
  // last key are never read, so they are never written either.
  Tensor<T> ds_buf = Tensor<T>::empty({nt, nt});  // (T, T)
  T* ds = ds_buf.data();
  constexpr std::int64_t blk = detail::attention_block;
  for (std::int64_t b = 0; b < nb; ++b) {
    for (std::int64_t h = 0; h < n_head; ++h) {
      const T* q = x.data() + b * nt * ld + h * hd;  // (T, hd), row stride 3C
      const T* k = q + c;
      const T* v = q + 2 * c;
      const T* p = pc.data() + (b * n_head + h) * nt * nt;  // (T, T)
      const T* go = gc.data() + b * nt * c + h * hd;         // (T, hd), row stride C
      T* dq = dqkv.tensor.data() + b * nt * ld + h * hd;     // (T, hd), row stride 3C
      T* dk = dq + c;
      T* dv = dq + 2 * c;
      for (std::int64_t i0 = 0; i0 < nt; i0 += blk) {
        const std::int64_t i1 = std::min(nt, i0 + blk);
        // dP = dout v^T over visible keys, then through the softmax: dS = P (dP - rowsum(P dP)).
        detail::gemm_2d(false, true, i1 - i0, i1, hd, T(1), go + i0 * c, c, v, ld, T(0), ds + i0 * nt, nt);
        for (std::int64_t i = i0; i < i1; ++i) {
          auto pr = detail::array_map(p + i * nt, i + 1);   // (i + 1,)
          auto dr = detail::array_map(ds + i * nt, i + 1);  // (i + 1,)
          const T dot = T(detail::sum(pr * dr));
          dr = pr * (dr - dot);
          std::fill(ds + i * nt + i + 1, ds + i * nt + i1, T(0));  // masked keys inside the block
        }
        // dq = dS k / sqrt(hd) for this block of queries.
        detail::gemm_2d(false, false, i1 - i0, hd, i1, scale, ds + i0 * nt, nt, k, ld, beta, dq + i0 * ld, ld);
      }
      for (std::int64_t j0 = 0; j0 < nt; j0 += blk) {
        const std::int64_t j1 = std::min(nt, j0 + blk);
        // Keys [j0, j1) are seen by queries [j0, T) only: dk = dS^T q / sqrt(hd), dv = P^T dout.
        detail::gemm_2d(true, false, j1 - j0, hd, nt - j0, scale, ds + j0 * nt + j0, nt, q + j0 * ld, ld, beta,
                        dk + j0 * ld, ld);
        detail::gemm_2d(true, false, j1 - j0, hd, nt - j0, T(1), p + j0 * nt + j0, nt, go + j0 * c, c, beta,
                        dv + j0 * ld, ld);
      }
    }
  }
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_ATTENTION_INSTANCES(EXTERN, T) \
  EXTERN template void causal_self_attention_forward<T>(const Tensor<T>&, int, const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void causal_self_attention_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, \
                                                         int, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_ATTENTION_INSTANCES)

}  // namespace polyshard
