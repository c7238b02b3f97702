// Causal attention of new positions over a key-value cache, for generating one token at a time:
// each step appends its keys and values to the cache and attends over everything cached, so
// a new token costs one position of work rather than the whole prefix again. Forward only.
#pragma once

#include <algorithm>
#include <cmath>

#include "polyshard/tensor/ops/attention.hpp"
#include "polyshard/tensor/ops/detail/array.hpp"
#include "polyshard/tensor/ops/matmul.hpp"

namespace polyshard {

namespace detail {

/// One batch element: q (tn, n_head hd) rows of stride ldq; k, v (tn, n_kv_head hd) rows of
/// stride ldkv; cache_k, cache_v (capacity, n_kv_head hd); out (tn, n_head hd) rows of stride
/// ldo; scores: room for tn (past + tn) elements. Query head h reads key-value head
/// h / (n_head / n_kv_head), as repeat_kv lays them out.
template <class T>
void cached_attention_rows(const T* q, std::int64_t ldq, const T* k, const T* v, std::int64_t ldkv, T* cache_k,
                           T* cache_v, std::int64_t past, std::int64_t tn, int n_head, int n_kv_head, std::int64_t hd,
                           T* out, std::int64_t ldo, T* scores) {
  const std::int64_t ckv = std::int64_t(n_kv_head) * hd, seen = past + tn;
  for (std::int64_t t = 0; t < tn; ++t) {
    std::copy_n(k + t * ldkv, ckv, cache_k + (past + t) * ckv);
    std::copy_n(v + t * ldkv, ckv, cache_v + (past + t) * ckv);
  }
  const T scale = T(1.0 / std::sqrt(double(hd)));
  const int group = n_head / n_kv_head;
  for (int h = 0; h < n_head; ++h) {
    const T* kh = cache_k + (h / group) * hd;  // (seen, hd), row stride ckv
    const T* vh = cache_v + (h / group) * hd;
    // Scores of the new queries against every cached key; query i sees keys [0, past + i].
    gemm_2d(false, true, tn, seen, hd, scale, q + h * hd, ldq, kh, ckv, T(0), scores, seen);
    for (std::int64_t i = 0; i < tn; ++i) {
      const std::int64_t visible = past + i + 1;
      auto row = array_map(scores + i * seen, visible);
      const T m = row.maxCoeff();
      exp_shift_scale(row.data(), m, T(1), row.data(), visible);
      row *= T(1.0 / sum(row));
      std::fill(scores + i * seen + visible, scores + (i + 1) * seen, T(0));
    }
    gemm_2d(false, false, tn, hd, seen, T(1), scores, seen, vh, ckv, T(0), out + h * hd, ldo);
  }
}

template <class T>
void check_cache(const char* op, const Tensor<T>& cache_k, const Tensor<T>& cache_v, std::int64_t batch,
                 std::int64_t ckv, std::int64_t past, std::int64_t tn) {
  POLYSHARD_CHECK(cache_k.rank() == 3 && cache_k.size(0) == batch && cache_k.size(2) == ckv, op,
                  ": the key cache must be (B, capacity, n_kv_head head_dim) = (", batch, ", capacity, ", ckv,
                  "), got shape ", cache_k.shape());
  check_same_shape(op, cache_v.shape(), cache_k.shape());
  POLYSHARD_CHECK(cache_k.is_contiguous() && cache_v.is_contiguous(), op, ": the caches must be contiguous");
  POLYSHARD_CHECK(past >= 0 && past + tn <= cache_k.size(1), op, ": ", past, " cached and ", tn,
                  " new positions exceed the cache's capacity of ", cache_k.size(1));
}

}  // namespace detail

/// out = softmax(q k^T / sqrt(head_dim), causal) v for `tn` new positions that follow `past`
/// cached ones. Appends k and v to rows [past, past + tn) of cache_k and cache_v first; query i
/// (position past + i) then attends over cache rows [0, past + i]. With past = 0 and a cache as
/// long as the sequence it computes what causal_self_attention does.
/// q: (B, tn, n_head hd); k, v: (B, tn, n_kv_head hd), all contiguous; cache_k, cache_v:
/// (B, capacity, n_kv_head hd); out: (B, tn, n_head hd). n_kv_head divides n_head (grouped-query
/// attention; n_kv_head = n_head is multi-head attention).
template <FloatElement T>
void cached_attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& cache_k,
                              const Tensor<T>& cache_v, std::int64_t past, int n_head, int n_kv_head,
                              const Tensor<T>& out) {
  static_assert(detail::is_compute_float_v<T>, "cached attention computes in float or double");
  constexpr const char* op = "cached_attention";
  POLYSHARD_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0, op, ": n_head (", n_head,
                  ") must be a positive multiple of n_kv_head (", n_kv_head, ")");
  POLYSHARD_CHECK(q.rank() == 3 && q.size(2) % n_head == 0, op, ": q must be (B, T, n_head head_dim), got shape ",
                  q.shape(), " for n_head = ", n_head);
  const std::int64_t nb = q.size(0), tn = q.size(1), hd = q.size(2) / n_head, ckv = hd * n_kv_head;
  check_same_shape(op, k.shape(), Shape{nb, tn, ckv});
  check_same_shape(op, v.shape(), Shape{nb, tn, ckv});
  POLYSHARD_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), op, ": q, k and v must be contiguous");
  detail::check_cache(op, cache_k, cache_v, nb, ckv, past, tn);
  detail::check_output(op, "out", out, q.shape());
  const std::int64_t capacity = cache_k.size(1), c = q.size(2);
  Tensor<T> scores = Tensor<T>::empty({tn, past + tn});
  for (std::int64_t b = 0; b < nb; ++b)
    detail::cached_attention_rows(q.data() + b * tn * c, c, k.data() + b * tn * ckv, v.data() + b * tn * ckv, ckv,
                                  cache_k.data() + b * capacity * ckv, cache_v.data() + b * capacity * ckv, past, tn,
                                  n_head, n_kv_head, hd, out.data() + b * tn * c, c, scores.data());
}

/// The same over GPT-2's fused projection: qkv (B, tn, 3C) laid out [q | k | v], n_kv_head = n_head.
template <FloatElement T>
void cached_attention_forward(const Tensor<T>& qkv, const Tensor<T>& cache_k, const Tensor<T>& cache_v,
                              std::int64_t past, int n_head, const Tensor<T>& out) {
  static_assert(detail::is_compute_float_v<T>, "cached attention computes in float or double");
  constexpr const char* op = "cached_attention";
  const auto [nb, tn, c, hd] = detail::attention_dims(op, qkv, n_head);
  detail::check_cache(op, cache_k, cache_v, nb, c, past, tn);
  detail::check_output(op, "out", out, Shape{nb, tn, c});
  const Tensor<T> x = qkv.contiguous();
  const std::int64_t capacity = cache_k.size(1);
  Tensor<T> scores = Tensor<T>::empty({tn, past + tn});
  for (std::int64_t b = 0; b < nb; ++b) {
    const T* row = x.data() + b * tn * 3 * c;
    detail::cached_attention_rows(row, 3 * c, row + c, row + 2 * c, 3 * c, cache_k.data() + b * capacity * c,
                                  cache_v.data() + b * capacity * c, past, tn, n_head, n_head, hd,
                                  out.data() + b * tn * c, c, scores.data());
  }
}

}  // namespace polyshard
