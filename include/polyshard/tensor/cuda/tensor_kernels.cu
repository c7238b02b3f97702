// Kernels behind Tensor<T, Cuda>'s methods: fill and strided copy, for every element type a
// tensor holds.
#include <cstdint>

#include "polyshard/core/cuda/device_math.cuh"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/tensor/cuda/tensor_kernels.hpp"

namespace polyshard::cuda {

namespace {

template <class T>
__global__ void fill_kernel(T* out, std::int64_t n, T value) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = value;
}

/// One output element per thread (grid-stride): its row-major index is unravelled into the
/// view's coordinates, innermost first.
template <class T>
__global__ void copy_view_kernel(T* out, const T* src, ViewLayout layout, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::int64_t rest = i, offset = 0;
    for (int d = layout.rank - 1; d >= 0; --d) {
      const std::int64_t extent = layout.shape[d];
      offset += (rest % extent) * layout.strides[d];
      rest /= extent;
    }
    out[i] = src[offset];
  }
}

}  // namespace

template <class T>
void fill_bits(T* out, std::int64_t n, std::uint64_t value_bits, cudaStream_t stream) {
  POLYSHARD_CHECK(n >= 0, "cuda::fill: negative element count ", n);
  if (n == 0) return;
  using D = device_t<T>;
  D v;
  __builtin_memcpy(static_cast<void*>(&v), &value_bits, sizeof(D));  // little-endian: the low bytes
  launch<fill_kernel<D>>(grid_for(static_cast<std::size_t>(n), 256), 256, 0, stream, device_ptr(out), n, v);
  POLYSHARD_CUDA_CHECK_LAUNCH("cuda::fill");
}

template <class T>
void copy_view(T* out, const T* src, const ViewLayout& layout, cudaStream_t stream) {
  POLYSHARD_CHECK(layout.rank >= 0 && layout.rank <= max_view_rank, "cuda::copy_view: rank ", layout.rank,
                  " is outside [0, ", max_view_rank, "]");
  std::int64_t n = 1;
  for (int d = 0; d < layout.rank; ++d) {
    POLYSHARD_CHECK(layout.shape[d] >= 0, "cuda::copy_view: negative extent ", layout.shape[d], " in dim ", d);
    n *= layout.shape[d];
  }
  if (n == 0) return;
  launch<copy_view_kernel<device_t<T>>>(grid_for(static_cast<std::size_t>(n), 256), 256, 0, stream, device_ptr(out),
                                        device_ptr(src), layout, n);
  POLYSHARD_CUDA_CHECK_LAUNCH("cuda::copy_view");
}

#define POLYSHARD_INSTANTIATE(T)                                                   \
  template void fill_bits<T>(T*, std::int64_t, std::uint64_t, cudaStream_t);                        \
  template void copy_view<T>(T*, const T*, const ViewLayout&, cudaStream_t);
POLYSHARD_INSTANTIATE(float)
POLYSHARD_INSTANTIATE(double)
POLYSHARD_INSTANTIATE(half)
POLYSHARD_INSTANTIATE(bfloat16)
POLYSHARD_INSTANTIATE(std::int32_t)
POLYSHARD_INSTANTIATE(std::int64_t)
#undef POLYSHARD_INSTANTIATE

}  // namespace polyshard::cuda
