// Launchers behind Tensor<T, Cuda>'s own methods: filling with a value and copying a strided view
// into contiguous memory. Plain C++ (no Eigen): CUDA translation units include it too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "polyshard/core/element_fwd.hpp"

namespace polyshard::cuda {

/// The largest rank a strided copy handles (Shape::max_rank).
inline constexpr int max_view_rank = 8;

/// A view's extents and element strides, passed to the kernel by value.
struct ViewLayout {
  int rank = 0;
  std::int64_t shape[max_view_rank] = {};
  std::int64_t strides[max_view_rank] = {};
};

/// out[i] = the element whose bytes are the low sizeof(T) bytes of `value_bits`, for i < n.
/// (Bits, not a T: this header and the kernels see half and bfloat16 by name only.)
/// out: (n,) device memory.
template <class T>
void fill_bits(T* out, std::int64_t n, std::uint64_t value_bits, cudaStream_t stream);

/// Copies the strided view at `src` into contiguous `out`, row-major.
/// src: a view with `layout`; out: (numel of layout,) device memory.
template <class T>
void copy_view(T* out, const T* src, const ViewLayout& layout, cudaStream_t stream);

}  // namespace polyshard::cuda
