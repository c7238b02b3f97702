// Grouped-query attention's key-value sharing: queries, keys and values of separate projections
// into the fused [q | k | v] layout causal_self_attention takes, each key-value head repeated
// for its group of query heads (Hugging Face's repeat_kv): forward and backward kernels.
#pragma once

#include <algorithm>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

namespace detail {
struct GroupedQkvDims {
  std::int64_t b, t, head_dim, n_head, n_kv_head;
};

/// The shapes grouped_qkv takes: q (B, T, n_head * head_dim), k and v (B, T, n_kv_head * head_dim),
/// n_head a multiple of n_kv_head.
template <class T, class D>
GroupedQkvDims grouped_qkv_dims(const char* op, const Tensor<T, D>& q, const Tensor<T, D>& k, const Tensor<T, D>& v,
                                int n_head, int n_kv_head) {
  POLYSHARD_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0, op, ": n_head (", n_head,
                  ") must be a positive multiple of n_kv_head (", n_kv_head, ")");
  POLYSHARD_CHECK(q.rank() == 3 && q.size(2) % n_head == 0 && q.size(2) > 0, op, ": q must be (B, T, n_head * head_dim) for n_head = ",
                  n_head, ", got shape ", q.shape());
  const std::int64_t hd = q.size(2) / n_head;
  const Shape kv{q.size(0), q.size(1), hd * n_kv_head};
  POLYSHARD_CHECK(k.shape() == kv && v.shape() == kv, op, ": k and v must be (B, T, n_kv_head * head_dim) = ", kv,
                  " for q ", q.shape(), " and n_kv_head = ", n_kv_head, ", got ", k.shape(), " and ", v.shape());
  return {q.size(0), q.size(1), hd, n_head, n_kv_head};
}

/// The checks grouped_qkv_backward makes on either device; returns the sizes dqkv implies.
template <class T, class D>
GroupedQkvDims check_grouped_qkv_backward(const Tensor<T, D>& dqkv, int n_head, int n_kv_head, const GradOut<T, D>& dq,
                                          const GradOut<T, D>& dk, const GradOut<T, D>& dv) {
  POLYSHARD_CHECK(dqkv.rank() == 3 && n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0 &&
                      dqkv.size(2) % (3 * std::int64_t(n_head)) == 0,
                  "grouped_qkv backward: dqkv of shape ", dqkv.shape(), " does not fit n_head = ", n_head,
                  " and n_kv_head = ", n_kv_head);
  const std::int64_t hd = dqkv.size(2) / 3 / n_head;
  const Shape q_shape{dqkv.size(0), dqkv.size(1), hd * n_head}, kv_shape{dqkv.size(0), dqkv.size(1), hd * n_kv_head};
  if (dq.wanted()) check_output("grouped_qkv backward", "dq", dq.tensor, q_shape);
  if (dk.wanted()) check_output("grouped_qkv backward", "dk", dk.tensor, kv_shape);
  if (dv.wanted()) check_output("grouped_qkv backward", "dv", dv.tensor, kv_shape);
  return {dqkv.size(0), dqkv.size(1), hd, n_head, n_kv_head};
}
}  // namespace detail

/// qkv = [q | repeat(k) | repeat(v)] along the last dimension: (B, T, 3 n_head head_dim), where
/// query head j reads key-value head j / (n_head / n_kv_head), as Hugging Face's repeat_kv.
/// q: (B, T, n_head head_dim); k, v: (B, T, n_kv_head head_dim); qkv contiguous.
template <FloatElement T>
void grouped_qkv_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, int n_head, int n_kv_head,
                         const Tensor<T>& qkv) {
  const auto d = detail::grouped_qkv_dims("grouped_qkv", q, k, v, n_head, n_kv_head);
  const std::int64_t c = d.n_head * d.head_dim, ckv = d.n_kv_head * d.head_dim, group = d.n_head / d.n_kv_head;
  detail::check_output("grouped_qkv", "qkv", qkv, Shape{d.b, d.t, 3 * c});
  const Tensor<T> qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  for (std::int64_t row = 0; row < d.b * d.t; ++row) {
    T* out = qkv.data() + row * 3 * c;
    std::copy_n(qc.data() + row * c, c, out);
    for (std::int64_t h = 0; h < d.n_head; ++h) {
      const std::int64_t from = row * ckv + (h / group) * d.head_dim;
      std::copy_n(kc.data() + from, d.head_dim, out + c + h * d.head_dim);
      std::copy_n(vc.data() + from, d.head_dim, out + 2 * c + h * d.head_dim);
    }
  }
}

/// Gradients of grouped_qkv_forward: dq (+)= dqkv's q part; dk and dv (+)= the sums of their
/// group's copies, added in head order. Each output is skipped when not wanted.
template <FloatElement T>
void grouped_qkv_backward(const Tensor<T>& dqkv, int n_head, int n_kv_head, const GradOut<T>& dq, const GradOut<T>& dk,
                          const GradOut<T>& dv) {
  const auto d = detail::check_grouped_qkv_backward(dqkv, n_head, n_kv_head, dq, dk, dv);
  const std::int64_t rows = d.b * d.t, hd = d.head_dim, c = hd * n_head, ckv = hd * n_kv_head, group = n_head / n_kv_head;
  const Tensor<T> g = dqkv.contiguous();
  for (std::int64_t row = 0; row < rows; ++row) {
    const T* in = g.data() + row * 3 * c;
    if (dq.wanted())
      detail::assign_or_add(detail::array_map(dq.tensor.data() + row * c, c), detail::array_map(in, c), dq.accumulate);
    for (int part = 1; part <= 2; ++part) {
      const GradOut<T>& out = part == 1 ? dk : dv;
      if (!out.wanted()) continue;
      for (std::int64_t kv = 0; kv < n_kv_head; ++kv) {
        auto sum = detail::array_map(out.tensor.data() + row * ckv + kv * hd, hd);
        const T* first = in + part * c + kv * group * hd;
        if (!out.accumulate) sum = detail::array_map(first, hd);
        else sum += detail::array_map(first, hd);
        for (std::int64_t j = 1; j < group; ++j) sum += detail::array_map(first + j * hd, hd);
      }
    }
  }
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_GROUPED_QKV_INSTANCES(EXTERN, T) \
  EXTERN template void grouped_qkv_forward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, int, int, \
                                              const Tensor<T>&); \
  EXTERN template void grouped_qkv_backward<T>(const Tensor<T>&, int, int, const GradOut<T>&, const GradOut<T>&, \
                                               const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_GROUPED_QKV_INSTANCES)

}  // namespace polyshard
