// Embedding lookup (a gather of table rows) and its backward (a scatter-add into the table).
#pragma once

#include <algorithm>
#include <cstdint>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

namespace detail {
/// Throws an Error naming the first index outside [0, v), its flat position and v.
inline void check_ids(const char* op, const Tensor<std::int32_t>& ids, std::int64_t v, const char* what = "id") {
  const Tensor<std::int32_t> c = ids.contiguous();
  const std::int32_t* p = c.data();
  const std::int64_t n = c.numel();
  for (std::int64_t i = 0; i < n; ++i)
    POLYSHARD_CHECK(p[i] >= 0 && p[i] < v, op, ": ", what, " ", p[i], " at position ", i,
                    " is out of range [0, V) for V = ", v);
}
}  // namespace detail

/// out[..., :] = table[ids[...], :]. ids: (...) in [0, V); table: (V, C); out: (..., C)
/// contiguous. Every id is checked before anything is written.
template <FloatElement T>
void embedding_forward(const Tensor<std::int32_t>& ids, const Tensor<T>& table, const Tensor<T>& out) {
  POLYSHARD_CHECK(table.rank() == 2, "embedding: table must be (V, C), got shape ", table.shape());
  const std::int64_t v = table.size(0), c = table.size(1);
  Shape out_shape = ids.shape();
  out_shape.push_back(c);
  detail::check_output("embedding", "out", out, out_shape);
  detail::check_ids("embedding", ids, v);
  const Tensor<std::int32_t> idc = ids.contiguous();
  const Tensor<T> tc = table.contiguous();
  const std::int64_t n = idc.numel();
  for (std::int64_t i = 0; i < n; ++i)
    std::copy_n(tc.data() + std::int64_t(idc.data()[i]) * c, c, out.data() + i * c);
}

namespace detail {
/// The shapes embedding_backward needs on every device: dtable (V, C) contiguous, dout the ids'
/// shape followed by C.
template <class T, class D>
void check_embedding_backward(const Tensor<std::int32_t, D>& ids, const Tensor<T, D>& dout,
                              const Tensor<T, D>& dtable) {
  POLYSHARD_CHECK(dtable.rank() == 2, "embedding backward: table gradient must be (V, C), got shape ",
                  dtable.shape());
  Shape dout_shape = ids.shape();
  dout_shape.push_back(dtable.size(1));
  check_same_shape("embedding backward", dout.shape(), dout_shape);
  check_output("embedding backward", "dtable", dtable, Shape{dtable.size(0), dtable.size(1)});
}
}  // namespace detail

/// dtable[ids[...], :] += dout[..., :] (a scatter-add: repeated ids add up). ids: (...), checked
/// by the forward pass; dout: (..., C); dtable: (V, C), zeroed first unless it accumulates.
template <FloatElement T>
void embedding_backward(const Tensor<std::int32_t>& ids, const Tensor<T>& dout, const GradOut<T>& dtable) {
  if (!dtable.wanted()) return;
  detail::check_embedding_backward(ids, dout, dtable.tensor);
  const std::int64_t v = dtable.tensor.size(0), c = dtable.tensor.size(1);
  detail::check_ids("embedding backward", ids, v);
  if (!dtable.accumulate) dtable.tensor.fill(T(0));
  const Tensor<std::int32_t> idc = ids.contiguous();
  const Tensor<T> dc = dout.contiguous();
  const std::int64_t n = idc.numel();
  for (std::int64_t i = 0; i < n; ++i)
    detail::array_map(dtable.tensor.data() + std::int64_t(idc.data()[i]) * c, c) +=
        detail::array_map(dc.data() + i * c, c);
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_EMBEDDING_INSTANCES(EXTERN, T) \
  EXTERN template void embedding_forward<T>(const Tensor<std::int32_t>&, const Tensor<T>&, const Tensor<T>&); \
  EXTERN template void embedding_backward<T>(const Tensor<std::int32_t>&, const Tensor<T>&, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_EMBEDDING_INSTANCES)

}  // namespace polyshard
