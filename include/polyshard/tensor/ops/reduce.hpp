// Whole-tensor reductions (sum, mean), accumulated in blocks added in double.
#pragma once

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

}  // namespace polyshard
