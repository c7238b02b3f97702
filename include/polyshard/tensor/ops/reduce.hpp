// Whole-tensor reductions (sum, mean), accumulated in blocks added in double.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"

namespace polyshard {

/// Sum of all elements of x (any shape; 16-bit types read as float), accumulated in blocks added in double.
template <FloatElement T>
double sum(const Tensor<T>& x) {
  const Tensor<T> xc = x.contiguous();
  return detail::sum(detail::array_map(xc.data(), xc.numel()));
}

/// Mean of all elements of x (any shape, at least one element), accumulated in blocks added in double.
template <FloatElement T>
double mean(const Tensor<T>& x) {
  POLYSHARD_CHECK(x.numel() > 0, "mean: tensor of shape ", x.shape(), " has no elements");
  return sum(x) / double(x.numel());
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_REDUCE_INSTANCES(EXTERN, T) \
  EXTERN template double sum<T>(const Tensor<T>&); \
  EXTERN template double mean<T>(const Tensor<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_REDUCE_INSTANCES)

}  // namespace polyshard
