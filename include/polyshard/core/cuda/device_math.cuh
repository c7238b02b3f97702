// What every polyshard kernel shares (device code only; include from .cu files): the CUDA type
// behind each host element type, conversions through float, 16-byte vector packs (and V
// consecutive elements loaded or stored through them) and warp and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "polyshard/core/cuda/launch.hpp"  // launch<kernel>(...), and the emulated device's built-ins
#include "polyshard/core/element_fwd.hpp"

namespace polyshard::cuda {

/// The CUDA type with the same bits as host element T (Eigen::half is laid out as __half,
/// Eigen::bfloat16 as __nv_bfloat16).
template <class T>
struct device_element {
  using type = T;
};
template <>
struct device_element<half> {
  using type = __half;
};
template <>
struct device_element<bfloat16> {
  using type = __nv_bfloat16;
};
template <class T>
using device_t = typename device_element<T>::type;

template <class T>
device_t<T>* device_ptr(T* p) {
  return reinterpret_cast<device_t<T>*>(p);
}
template <class T>
const device_t<T>* device_ptr(const T* p) {
  return reinterpret_cast<const device_t<T>*>(p);
}

// Arithmetic runs in float for the 16-bit types (as on the CPU), in the type itself otherwise.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ double to_float(double x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/// The arithmetic type of device element T: float for the 16-bit types.
template <class T>
struct accumulate_type {
  using type = float;
};
template <>
struct accumulate_type<double> {
  using type = double;
};
template <class T>
using acc_t = typename accumulate_type<T>::type;

template <class To, class From>
__device__ __forceinline__ To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, double>) {
    return static_cast<double>(to_float(x));
  } else if constexpr (std::is_same_v<From, double>) {
    return from_float<To>(static_cast<float>(x));
  } else {
    return from_float<To>(to_float(x));
  }
}

/// Sixteen bytes of T: one 128-bit load or store (LDG.128 / STG.128).
template <class T>
struct alignas(16) Pack {
  static constexpr int size = 16 / sizeof(T);
  T v[size];
};

template <class T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  Pack<T> r;
  *reinterpret_cast<int4*>(&r) = *reinterpret_cast<const int4*>(p);
  return r;
}
template <class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& r) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&r);
}

// x[0, V) = p[0, V): one scalar load when V == 1 (any alignment), else V / Pack<T>::size 128-bit
// loads (p 16-byte aligned).
template <int V, class T>
__device__ __forceinline__ void load_lanes(const T* p, T (&x)[V]) {
  if constexpr (V == 1) {
    x[0] = *p;
  } else {
    constexpr int per = Pack<T>::size;
    static_assert(V % per == 0, "load_lanes: V must be a whole number of 16-byte packs");
#pragma unroll
    for (int k = 0; k < V / per; ++k) {
      const Pack<T> q = load_pack(p + k * per);
#pragma unroll
      for (int j = 0; j < per; ++j) x[k * per + j] = q.v[j];
    }
  }
}

// p[0, V) = x[0, V), as load_lanes reads.
template <int V, class T>
__device__ __forceinline__ void store_lanes(T* p, const T (&x)[V]) {
  if constexpr (V == 1) {
    *p = x[0];
  } else {
    constexpr int per = Pack<T>::size;
    static_assert(V % per == 0, "store_lanes: V must be a whole number of 16-byte packs");
#pragma unroll
    for (int k = 0; k < V / per; ++k) {
      Pack<T> q;
#pragma unroll
      for (int j = 0; j < per; ++j) q.v[j] = x[k * per + j];
      store_pack(p + k * per, q);
    }
  }
}

/// Whether every pointer is 16-byte aligned, so that whole packs can be used.
__host__ __device__ inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

constexpr unsigned full_warp = 0xffffffffu;

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(full_warp, v, o);
  return v;
}
template <class A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(full_warp, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
/// `shared` holds 32 values; the call synchronises the block.
template <class A>
__device__ __forceinline__ A block_sum(A v, A* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : A(0);
  return warp_sum(v);
}
template <class A>
__device__ __forceinline__ A block_max(A v, A* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : A(-INFINITY);
  return warp_max(v);
}

/// 2^x by the special-function unit alone (PTX ex2.approx.ftz.f32: relative error about 2^-22,
/// results below 2^-126 flushed to zero). exp2f without fast-math wraps the same instruction in
/// a range check and two multiplies that keep subnormal results, which softmax probabilities
/// never need; in an attention kernel's inner loop those three instructions an element cost
/// more than the exponential. -inf gives 0. The emulated device computes it in float and flushes
/// the same way.
__device__ __forceinline__ float exp2_ftz(float x) {
#if defined(POLYSHARD_CUDA_EMULATION)
  const float y = exp2f(x);
  return y < 1.17549435e-38f ? 0.0f : y;
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

/// Blocks for `n` independent items at `per_block` each, capped for grid-stride loops.
inline unsigned grid_for(std::size_t n, unsigned per_block, unsigned cap = 65535u * 8u) {
  const std::size_t g = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(g == 0 ? 1 : (g > cap ? cap : g));
}

}  // namespace polyshard::cuda
