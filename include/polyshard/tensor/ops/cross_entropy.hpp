// Cross-entropy of logits against integer targets, fused with the log-softmax: forward and
// backward kernels.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/embedding.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

namespace detail {
/// The shape of one value per row of `logits` (its shape without the last dimension).
inline Shape row_shape(const Shape& logits) {
  Shape s;
  for (int i = 0; i < logits.rank() - 1; ++i) s.push_back(logits[i]);
  return s;
}

template <class T, class D>
void check_cross_entropy(const char* op, const Tensor<T, D>& logits, const Tensor<std::int32_t, D>& targets) {
  POLYSHARD_CHECK(logits.rank() >= 1 && logits.size(-1) > 0, op, ": logits need a non-empty last dimension, got shape ",
                  logits.shape());
  POLYSHARD_CHECK(targets.shape() == row_shape(logits.shape()), op, ": targets of shape ", targets.shape(),
                  " do not fit logits of shape ", logits.shape(), " (expected ", row_shape(logits.shape()), ")");
}
}  // namespace detail

/// The row length of a language-model head's logits on a GPU: the vocabulary rounded up to a
/// multiple of 64, so that every row starts 128-byte aligned. Packed rows of GPT-2's 50257 logits
/// are only 2-byte aligned, and cuBLASLt's products over them run 5 to 8 times slower.
inline std::int64_t padded_vocab(std::int64_t v) { return (v + 63) / 64 * 64; }

/// Whether a GPU's linear_cross_entropy turns the logits into their gradient during the forward.
/// Not for half: that unscaled gradient's small probabilities (about 1/V) fall below half's
/// normal range, where the loss scale applied in the backward keeps them; bfloat16 and float have
/// float's exponent range.
template <class T>
inline constexpr bool logits_gradient_in_place = !std::same_as<T, half>;

/// losses[i] = lse[i] - logits[i, targets[i]] with lse[i] = log(sum(exp(logits[i, :]))), computed
/// stably (shifted by the row's max; partial sums added in double). logits: (..., V); targets: (...) in
/// [0, V), checked first; losses, lse: (...), contiguous; lse is saved for the backward pass.
template <FloatElement T>
void cross_entropy_forward(const Tensor<T>& logits, const Tensor<std::int32_t>& targets, const Tensor<T>& losses,
                           const Tensor<T>& lse) {
  static_assert(detail::is_compute_float_v<T>,
                "cross_entropy computes in float or double: cast half and bfloat16 logits to float first");
  detail::check_cross_entropy("cross_entropy", logits, targets);
  const Shape rows_shape = detail::row_shape(logits.shape());
  detail::check_output("cross_entropy", "losses", losses, rows_shape);
  detail::check_output("cross_entropy", "lse", lse, rows_shape);
  const std::int64_t v = logits.size(-1), rows = rows_shape.numel();
  detail::check_ids("cross_entropy", targets, v, "target");
  const Tensor<T> lc = logits.contiguous();
  const Tensor<std::int32_t> tc = targets.contiguous();
  for (std::int64_t r = 0; r < rows; ++r) {
    auto lr = detail::array_map(lc.data() + r * v, v);  // (V,)
    const T m = lr.maxCoeff();
    const double l = double(m) + std::log(detail::sum_exp_shift(lr.data(), m, v));
    lse.data()[r] = T(l);
    losses.data()[r] = T(l - double(lr[tc.data()[r]]));
  }
}

/// dlogits[i, :] (+)= dlosses[i] (softmax(logits[i, :]) - onehot(targets[i])), the softmax
/// rebuilt from the saved lse. logits: (..., V); targets, lse, dlosses: (...); dlogits: (..., V).
template <FloatElement T>
void cross_entropy_backward(const Tensor<T>& logits, const Tensor<std::int32_t>& targets, const Tensor<T>& lse,
                            const Tensor<T>& dlosses, const GradOut<T>& dlogits) {
  static_assert(detail::is_compute_float_v<T>,
                "cross_entropy computes in float or double: cast half and bfloat16 logits to float first");
  if (!dlogits.wanted()) return;
  detail::check_cross_entropy("cross_entropy backward", logits, targets);
  const Shape rows_shape = detail::row_shape(logits.shape());
  check_same_shape("cross_entropy backward", lse.shape(), rows_shape);
  check_same_shape("cross_entropy backward", dlosses.shape(), rows_shape);
  detail::check_output("cross_entropy backward", "dlogits", dlogits.tensor, logits.shape());
  const std::int64_t v = logits.size(-1), rows = rows_shape.numel();
  detail::check_ids("cross_entropy backward", targets, v, "target");
  const Tensor<T> lc = logits.contiguous(), sc = lse.contiguous(), gc = dlosses.contiguous();
  const Tensor<std::int32_t> tc = targets.contiguous();
  alignas(64) T buf[detail::exp_block];  // g softmax of one block of a row
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* lr = lc.data() + r * v;              // (V,)
    T* dr = dlogits.tensor.data() + r * v;        // (V,)
    const T g = gc.data()[r];
    if (!dlogits.accumulate) {
      detail::exp_shift_scale(lr, sc.data()[r], g, dr, v);
    } else {
      for (std::int64_t s = 0; s < v; s += detail::exp_block) {
        const std::int64_t m = std::min(detail::exp_block, v - s);
        detail::exp_shift_scale(lr + s, sc.data()[r], g, buf, m);
        detail::array_map(dr + s, m) += detail::array_map(static_cast<const T*>(buf), m);
      }
    }
    dr[tc.data()[r]] -= g;
  }
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_CROSS_ENTROPY_INSTANCES(EXTERN, T) \
  EXTERN template void cross_entropy_forward<T>(const Tensor<T>&, const Tensor<std::int32_t>&, const Tensor<T>&, \
                                                const Tensor<T>&); \
  EXTERN template void cross_entropy_backward<T>(const Tensor<T>&, const Tensor<std::int32_t>&, const Tensor<T>&, \
                                                 const Tensor<T>&, const GradOut<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_CROSS_ENTROPY_INSTANCES)

}  // namespace polyshard
