// The unit kernels: pack / unpack of a unit's tensors, master <-> compute casts, unscaling with
// the overflow check, and the deterministic partial sums of the gradient norm.
//
// Every kernel splits its span the same way: a grid-stride loop over whole groups of V
// consecutive elements (V fills one 128-bit access of the narrowest array; V = 1 when an array
// is not 16-byte aligned), then the last n % V elements (fewer than V) one each to the first
// threads of the grid. Every element is read and written by exactly one thread.
#include "polyshard/engine/cuda/unit_kernels.hpp"

#include <algorithm>
#include <cmath>

#include "polyshard/core/cuda/device_math.cuh"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/error.hpp"

namespace polyshard::cuda {
namespace {

constexpr unsigned threads_per_block = 256;
// The tail after the whole V-groups (fewer than V <= 16 elements) goes one element per thread to
// the grid's first threads, so one block must have at least that many.
static_assert(threads_per_block >= 16 && threads_per_block % 32 == 0, "whole warps, enough for any tail");

// Blocks of a pack or unpack launch at most: each thread reads every table entry, so the grid
// stays near one wave of the GPU and the larger units loop.
constexpr unsigned max_unit_copy_blocks = 2048;

__device__ __forceinline__ std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_threads() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// Blocks for n elements taken V at a time (at least one block, for the tail).
unsigned blocks_for(std::size_t n, int v, unsigned cap = 65535u * 8u) {
  return grid_for(std::max<std::size_t>(n / static_cast<std::size_t>(v), 1), threads_per_block, cap);
}

// ---- pack / unpack -------------------------------------------------------------------------------

// dst[0, n) = src[0, n), by the thread numbered `first` of `stride` threads.
template <int V, class D>
__device__ __forceinline__ void copy_lanes(const D* __restrict__ src, D* __restrict__ dst, std::size_t n,
                                           std::size_t first, std::size_t stride) {
  const std::size_t whole = n / V * V;
  for (std::size_t i = first * V; i < whole; i += stride * V) {
    if constexpr (V == 1) {
      dst[i] = src[i];
    } else {
      // The 16 bytes as one int4, stored with __stwb (a plain store, write-back): with a plain
      // assignment nvcc splits the pack's store into four 4-byte stores in this kernel.
      static_assert(V * sizeof(D) == 16, "copy_lanes: V elements fill one 16-byte pack");
      __stwb(reinterpret_cast<int4*>(dst + i), __ldg(reinterpret_cast<const int4*>(src + i)));
    }
  }
  if (whole + first < n) dst[whole + first] = src[whole + first];
}

// Every block walks the whole table; entry e is split over the grid with its blocks renumbered
// to start at block e % gridDim.x (a rotation: each element still has exactly one thread), so
// that a run of small entries spreads over the grid instead of queueing on block 0.
// ToFlat: flat_out[offset + i] = tensor[i] (pack); else tensor[i] = flat_in[offset + i] (unpack).
template <bool ToFlat, class T>
__global__ void __launch_bounds__(threads_per_block)
    unit_copy_kernel(const UnitEntry<T>* __restrict__ table, std::size_t entries, device_t<T>* flat_out,
                     const device_t<T>* flat_in) {
  using D = device_t<T>;
  constexpr int V = Pack<D>::size;
  const std::size_t stride = grid_threads();
  for (std::size_t e = 0; e < entries; ++e) {
    const UnitEntry<T> entry = table[e];
    const std::size_t block = (blockIdx.x + gridDim.x - e % gridDim.x) % gridDim.x;
    const std::size_t first = block * blockDim.x + threadIdx.x;
    const D* src;
    D* dst;
    if constexpr (ToFlat) {
      src = reinterpret_cast<const D*>(entry.tensor);
      dst = flat_out + entry.offset;
    } else {
      src = flat_in + entry.offset;
      dst = reinterpret_cast<D*>(entry.tensor);
    }
    // The same branch for every thread of the grid: both pointers are the entry's.
    if (aligned16(src) && aligned16(dst)) {
      copy_lanes<V>(src, dst, entry.numel, first, stride);
    } else {
      copy_lanes<1>(src, dst, entry.numel, first, stride);
    }
  }
}

// ---- casts ---------------------------------------------------------------------------------------

template <int V, class DF, class DT>
__global__ void __launch_bounds__(threads_per_block)
    cast_kernel(const DF* __restrict__ src, DT* __restrict__ dst, std::size_t n) {
  const std::size_t first = global_thread(), stride = grid_threads();
  const std::size_t whole = n / V * V;
  for (std::size_t i = first * V; i < whole; i += stride * V) {
    DF x[V];
    DT y[V];
    load_lanes<V>(src + i, x);
#pragma unroll
    for (int j = 0; j < V; ++j) y[j] = convert<DT>(x[j]);
    store_lanes<V>(dst + i, y);
  }
  if (whole + first < n) dst[whole + first] = convert<DT>(src[whole + first]);
}

// ---- unscale with the overflow check -------------------------------------------------------------

// Neither inf nor NaN (NaN compares false).
__device__ __forceinline__ bool is_finite(float x) { return fabsf(x) < INFINITY; }

// Unscales p[0, V) in place; true when an element was not finite before or after.
template <int V, class D>
__device__ __forceinline__ bool unscale_lanes(D* p, float inv_scale) {
  D x[V];
  load_lanes<V>(p, x);
  bool bad = false;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float before = to_float(x[j]);
    x[j] = from_float<D>(__fmul_rn(before, inv_scale));
    bad = bad || !is_finite(before) || !is_finite(to_float(x[j]));
  }
  store_lanes<V>(p, x);
  return bad;
}

template <int V, class D>
__global__ void __launch_bounds__(threads_per_block)
    unscale_and_check_kernel(D* __restrict__ grad, std::size_t n, float inv_scale, int* __restrict__ found_nonfinite) {
  const std::size_t first = global_thread(), stride = grid_threads();
  const std::size_t whole = n / V * V;
  bool bad = false;
  for (std::size_t i = first * V; i < whole; i += stride * V) {
    if (unscale_lanes<V>(grad + i, inv_scale)) bad = true;
  }
  if (whole + first < n && unscale_lanes<1>(grad + whole + first, inv_scale)) bad = true;
  // Every thread of the warp gets here (no early return); one store per warp that saw a bad value.
  if (__any_sync(full_warp, bad) && threadIdx.x % 32 == 0) atomicExch(found_nonfinite, 1);
}

// ---- gradient norm -------------------------------------------------------------------------------

// Each thread keeps V running sums (lane j of its groups), adds them in lane order, then its
// tail element; the block adds its threads' sums in block_sum's fixed tree. The grid is always
// squared_norm_blocks blocks, so each block's share, and each partial's bits, depend only on the
// span's size and alignment.
template <int V, class D>
__global__ void __launch_bounds__(threads_per_block)
    squared_norm_partials_kernel(const D* __restrict__ grad, std::size_t n, float* __restrict__ partials,
                                 bool accumulate) {
  POLYSHARD_SHARED(float, shared, [32]);
  const std::size_t first = global_thread(), stride = grid_threads();
  const std::size_t whole = n / V * V;
  float lane_sum[V] = {};
  for (std::size_t i = first * V; i < whole; i += stride * V) {
    D x[V];
    load_lanes<V>(grad + i, x);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float a = to_float(x[j]);
      lane_sum[j] = __fmaf_rn(a, a, lane_sum[j]);
    }
  }
  float sum = lane_sum[0];
#pragma unroll
  for (int j = 1; j < V; ++j) sum = __fadd_rn(sum, lane_sum[j]);
  if (whole + first < n) {
    const float a = to_float(grad[whole + first]);
    sum = __fmaf_rn(a, a, sum);
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = accumulate ? __fadd_rn(partials[blockIdx.x], sum) : sum;
}

// One block of squared_norm_blocks threads, one partial each, added in double in block_sum's tree.
__global__ void __launch_bounds__(squared_norm_blocks)
    squared_norm_finish_kernel(const float* __restrict__ partials, float* __restrict__ out, bool accumulate) {
  POLYSHARD_SHARED(double, shared, [32]);
  const double sum = block_sum(static_cast<double>(partials[threadIdx.x]), shared);
  if (threadIdx.x == 0) *out = static_cast<float>(accumulate ? static_cast<double>(*out) + sum : sum);
}

static_assert(squared_norm_blocks % 32 == 0 && squared_norm_blocks <= 1024,
              "squared_norm_finish: one block of squared_norm_blocks threads, whole warps");

}  // namespace

template <class T>
void pack_unit(const UnitEntry<T>* table, std::size_t entries, std::size_t total_numel, T* flat, cudaStream_t stream) {
  if (entries == 0) return;
  POLYSHARD_CHECK(table != nullptr && flat != nullptr, "pack_unit: null pointer for ", entries, " entries (table ",
                  static_cast<const void*>(table), ", flat ", static_cast<const void*>(flat), ")");
  using D = device_t<T>;
  launch<unit_copy_kernel<true, T>>(blocks_for(total_numel, Pack<D>::size, max_unit_copy_blocks), threads_per_block, 0,
                                    stream, table, entries, device_ptr(flat), nullptr);
  POLYSHARD_CUDA_CHECK_LAUNCH("pack_unit");
}

template <class T>
void unpack_unit(const UnitEntry<T>* table, std::size_t entries, std::size_t total_numel, const T* flat,
                 cudaStream_t stream) {
  if (entries == 0) return;
  POLYSHARD_CHECK(table != nullptr && flat != nullptr, "unpack_unit: null pointer for ", entries, " entries (table ",
                  static_cast<const void*>(table), ", flat ", static_cast<const void*>(flat), ")");
  using D = device_t<T>;
  launch<unit_copy_kernel<false, T>>(blocks_for(total_numel, Pack<D>::size, max_unit_copy_blocks), threads_per_block, 0,
                                     stream, table, entries, nullptr, device_ptr(flat));
  POLYSHARD_CUDA_CHECK_LAUNCH("unpack_unit");
}

template <class From, class To>
void cast_span(const From* src, To* dst, std::size_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  POLYSHARD_CHECK(src != nullptr && dst != nullptr, "cast_span: null array for ", numel, " elements (src ",
                  static_cast<const void*>(src), ", dst ", static_cast<const void*>(dst), ")");
  using DF = device_t<From>;
  using DT = device_t<To>;
  const auto s = device_ptr(src);
  const auto d = device_ptr(dst);
  if (aligned16(s) && aligned16(d)) {
    constexpr int V = static_cast<int>(16 / std::min(sizeof(DF), sizeof(DT)));
    launch<cast_kernel<V, DF, DT>>(blocks_for(numel, V), threads_per_block, 0, stream, s, d, numel);
  } else {
    launch<cast_kernel<1, DF, DT>>(blocks_for(numel, 1), threads_per_block, 0, stream, s, d, numel);
  }
  POLYSHARD_CUDA_CHECK_LAUNCH("cast_span");
}

template <class G>
void unscale_and_check(G* grad, std::size_t numel, float inv_scale, int* found_nonfinite, cudaStream_t stream) {
  POLYSHARD_CHECK(std::isfinite(inv_scale), "unscale_and_check: inv_scale must be finite, got ", inv_scale);
  if (numel == 0) return;
  POLYSHARD_CHECK(grad != nullptr && found_nonfinite != nullptr, "unscale_and_check: null pointer for ", numel,
                  " elements (grad ", static_cast<const void*>(grad), ", found_nonfinite ",
                  static_cast<const void*>(found_nonfinite), ")");
  using D = device_t<G>;
  const auto g = device_ptr(grad);
  if (aligned16(g)) {
    constexpr int V = Pack<D>::size;
    launch<unscale_and_check_kernel<V, D>>(blocks_for(numel, V), threads_per_block, 0, stream, g, numel, inv_scale,
                                           found_nonfinite);
  } else {
    launch<unscale_and_check_kernel<1, D>>(blocks_for(numel, 1), threads_per_block, 0, stream, g, numel, inv_scale,
                                           found_nonfinite);
  }
  POLYSHARD_CUDA_CHECK_LAUNCH("unscale_and_check");
}

template <class G>
void squared_norm_partials(const G* grad, std::size_t numel, float* partials, bool accumulate, cudaStream_t stream) {
  POLYSHARD_CHECK(partials != nullptr && (grad != nullptr || numel == 0), "squared_norm_partials: null pointer (grad ",
                  static_cast<const void*>(grad), " for ", numel, " elements, partials ",
                  static_cast<const void*>(partials), ")");
  if (numel == 0 && accumulate) return;  // adds nothing
  using D = device_t<G>;
  const auto g = device_ptr(grad);
  if (g != nullptr && aligned16(g)) {
    constexpr int V = Pack<D>::size;
    launch<squared_norm_partials_kernel<V, D>>(squared_norm_blocks, threads_per_block, 0, stream, g, numel, partials,
                                               accumulate);
  } else {
    launch<squared_norm_partials_kernel<1, D>>(squared_norm_blocks, threads_per_block, 0, stream, g, numel, partials,
                                               accumulate);
  }
  POLYSHARD_CUDA_CHECK_LAUNCH("squared_norm_partials");
}

void squared_norm_finish(const float* partials, float* out, bool accumulate, cudaStream_t stream) {
  POLYSHARD_CHECK(partials != nullptr && out != nullptr, "squared_norm_finish: null pointer (partials ",
                  static_cast<const void*>(partials), ", out ", static_cast<const void*>(out), ")");
  launch<squared_norm_finish_kernel>(1, squared_norm_blocks, 0, stream, partials, out, accumulate);
  POLYSHARD_CUDA_CHECK_LAUNCH("squared_norm_finish");
}

// The element types of master weights (float), compute copies and gradients (float, bf16, fp16).
#define POLYSHARD_INSTANTIATE_UNIT(T)                                                                              \
  template void pack_unit<T>(const UnitEntry<T>*, std::size_t, std::size_t, T*, cudaStream_t);                     \
  template void unpack_unit<T>(const UnitEntry<T>*, std::size_t, std::size_t, const T*, cudaStream_t);             \
  template void unscale_and_check<T>(T*, std::size_t, float, int*, cudaStream_t);                                  \
  template void squared_norm_partials<T>(const T*, std::size_t, float*, bool, cudaStream_t);
POLYSHARD_INSTANTIATE_UNIT(float)
POLYSHARD_INSTANTIATE_UNIT(half)
POLYSHARD_INSTANTIATE_UNIT(bfloat16)
#undef POLYSHARD_INSTANTIATE_UNIT

// Master <-> compute casts, and the same-type copies.
#define POLYSHARD_INSTANTIATE_CAST(From, To) \
  template void cast_span<From, To>(const From*, To*, std::size_t, cudaStream_t);
POLYSHARD_INSTANTIATE_CAST(float, bfloat16)
POLYSHARD_INSTANTIATE_CAST(bfloat16, float)
POLYSHARD_INSTANTIATE_CAST(float, half)
POLYSHARD_INSTANTIATE_CAST(half, float)
POLYSHARD_INSTANTIATE_CAST(float, float)
POLYSHARD_INSTANTIATE_CAST(bfloat16, bfloat16)
POLYSHARD_INSTANTIATE_CAST(half, half)
#undef POLYSHARD_INSTANTIATE_CAST

}  // namespace polyshard::cuda
