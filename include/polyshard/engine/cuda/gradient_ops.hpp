// The device twins of engine/gradient_ops.hpp: the overflow check, the squared norm and
// scaling of a unit's reduced gradients in device memory, on the thread's current stream.
// Each returns to the host what the step decides on (a flag, a norm), so each waits.
#pragma once

#include <cmath>
#include <cstdint>

#include "polyshard/core/cuda/current_stream.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/engine/cuda/unit_kernels.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/storage.hpp"

namespace polyshard {

/// Whether any element of `grads` is inf or NaN (the host twin's contract): the unscaling
/// kernel at a scale of 1, which writes each value back unchanged.
template <CudaFloatElement G>
bool has_nonfinite(const Tensor<G, Cuda>& grads) {
  auto flag = Tensor<std::int32_t, Cuda>::zeros({1}, MemoryCategory::Other);
  const auto g = grads.span();
  cuda::unscale_and_check(g.data(), g.size(), 1.0f, flag.data(), cuda::current_stream());
  return flag.to_vector()[0] != 0;
}

/// Sum of the squares of `grads`: fixed-order partial sums in float, finished in double on the
/// device and rounded once to float (deterministic run to run).
template <CudaFloatElement G>
double squared_norm(const Tensor<G, Cuda>& grads) {
  auto partials = Tensor<float, Cuda>::empty({static_cast<std::int64_t>(cuda::squared_norm_blocks)}, MemoryCategory::Other);
  auto out = Tensor<float, Cuda>::empty({1}, MemoryCategory::Other);
  const auto g = grads.span();
  cuda::squared_norm_partials(g.data(), g.size(), partials.data(), false, cuda::current_stream());
  cuda::squared_norm_finish(partials.data(), out.data(), false, cuda::current_stream());
  return static_cast<double>(out.to_vector()[0]);
}

/// grads *= factor (in float for the 16-bit types).
template <CudaFloatElement G>
void scale_gradients(const Tensor<G, Cuda>& grads, double factor) {
  scale_into(grads, factor, grads);
}

}  // namespace polyshard
