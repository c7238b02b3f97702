// Converting a tensor's elements to another element type (float <-> bfloat16 / half, ints).
#pragma once

#include "polyshard/core/cpu_workers.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// out = x converted elementwise by element_cast (round to nearest even into 16-bit types).
/// x, out: one shape; out contiguous. A large tensor is split over the host's worker pool
/// (detail::parallel_ranges, as many threads as set_optimizer_threads allows): a mixed-precision
/// step casts every parameter or gradient at least once on the host (the compute copy written
/// from the masters, a host model's float working copy), and one core converting hundreds of
/// megabytes leaves the others idle.
template <Element To, Element From>
void cast_into(const Tensor<From>& x, const Tensor<To>& out) {
  check_same_shape("cast", x.shape(), out.shape());
  POLYSHARD_CHECK(out.is_contiguous(), "cast: output of shape ", out.shape(), " is not contiguous");
  const Tensor<From> xc = x.contiguous();
  const From* px = xc.data();
  To* po = out.data();
  detail::parallel_ranges(static_cast<std::size_t>(x.numel()), [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) po[i] = element_cast<To>(px[i]);
  });
}

/// x converted to element type `To`, as a new tensor of x's shape (a copy even when To == From,
/// so the result never aliases x).
template <Element To, Element From>
Tensor<To> cast(const Tensor<From>& x, MemoryCategory category = current_memory_category()) {
  Tensor<To> out = Tensor<To>::empty(x.shape(), category);
  cast_into(x, out);
  return out;
}

/// out = x converted to To, x and out in the memory of any two devices: the conversion runs
/// where x is, then the result moves (one transfer, of To's elements; from the host, out of
/// the memory the device copies fastest from).
template <Element To, Element From, Device D1, Device D2>
void cast_across(const Tensor<From, D1>& x, const Tensor<To, D2>& out) {
  if constexpr (std::same_as<D1, D2>) {
    cast_into(x, out);
  } else if constexpr (std::same_as<From, To>) {
    copy_across(x, out);
  } else {
    Tensor<To, D1> converted;
    if constexpr (std::same_as<D1, Cpu>)
      converted = host_staging_tensor<To, D2>(x.shape(), MemoryCategory::Communication);
    else
      converted = Tensor<To, D1>::empty(x.shape(), MemoryCategory::Communication);
    cast_into(x, converted);
    copy_across(converted, out);
  }
}

}  // namespace polyshard
