// Converting a tensor's elements to another element type (float <-> bfloat16 / half, ints).
#pragma once

#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// out = x converted elementwise by element_cast (round to nearest even into 16-bit types).
/// x, out: one shape; out contiguous.
template <Element To, Element From>
void cast_into(const Tensor<From>& x, const Tensor<To>& out) {
  check_same_shape("cast", x.shape(), out.shape());
  POLYSHARD_CHECK(out.is_contiguous(), "cast: output of shape ", out.shape(), " is not contiguous");
  const Tensor<From> xc = x.contiguous();
  const From* px = xc.data();
  To* po = out.data();
  const std::int64_t n = x.numel();
  for (std::int64_t i = 0; i < n; ++i) po[i] = element_cast<To>(px[i]);
}

/// x converted to element type `To`, as a new tensor of x's shape (a copy even when To == From,
/// so the result never aliases x).
template <Element To, Element From>
Tensor<To> cast(const Tensor<From>& x, MemoryCategory category = current_memory_category()) {
  Tensor<To> out = Tensor<To>::empty(x.shape(), category);
  cast_into(x, out);
  return out;
}

}  // namespace polyshard
