// Where a backward kernel writes one gradient: overwrite the first contribution, add later ones.
#pragma once

#include "polyshard/tensor/ops/detail/array.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// One gradient output of a backward kernel: a contiguous tensor that the kernel overwrites, or
/// adds to when `accumulate` is true. An undefined tensor means the gradient is not wanted and
/// the kernel skips it (and the work that only it needs).
template <Element T, Device D = Cpu>
struct GradOut {
  Tensor<T, D> tensor;
  bool accumulate = false;
  bool wanted() const { return tensor.defined(); }
};

}  // namespace polyshard
