// The CUDA WMMA API (nvcuda::wmma, <mma.h>) on the emulated device: warp-wide 16x16x16 matrix
// products of half or bfloat16 tiles with float accumulators, as a kernel compiled by the host
// compiler sees them. Included by polyshard/core/cuda/wmma.cuh under POLYSHARD_CUDA_EMULATION.
//
// A fragment's layout is opaque on a GPU; here lane l holds elements 8l .. 8l + 7 of its tile in
// row-major order (M x K for matrix_a, K x N for matrix_b, M x N for the accumulator). Code that
// treats x[] as anything but a bag of elements of one tile (scaling every element, say) is
// wrong on a GPU and is not helped here either. Every operation is warp-collective, as the CUDA
// programming guide requires: each one is a __syncwarp over the whole warp, so a lane that skips
// one is reported as a barrier fault. Loads and stores check what the guide requires of their
// arguments (a 256-bit aligned pointer, ldm a multiple of 16 bytes) and fault otherwise.
#pragma once

#if !defined(POLYSHARD_CUDA_EMULATION)
#error "polyshard/emulation/wmma.hpp is for kernel sources compiled by a host compiler (POLYSHARD_CUDA_EMULATION)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "polyshard/emulation/grid.hpp"
#include "polyshard/emulation/runtime.hpp"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <class Use, int M, int N, int K>
constexpr int rows() {
  return std::is_same_v<Use, matrix_b> ? K : M;
}
template <class Use, int M, int N, int K>
constexpr int cols() {
  return std::is_same_v<Use, matrix_a> ? K : N;
}

inline float to_float(float x) { return x; }
inline float to_float(__half x) { return __half2float(x); }
inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return x;
}

[[noreturn]] inline void fault(const std::string& what) {
  throw ::polyshard::emulation::DeviceFault{cudaErrorMisalignedAddress, "wmma: " + what};
}

/// The guide's requirements on a load's or store's memory: the pointer 256-bit aligned and
/// ldm a multiple of 16 bytes (8 elements of 16 bits, 4 floats).
template <class E>
void check_memory(const char* op, const void* p, unsigned ldm, int row_length) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0)
    fault(std::string(op) + ": the pointer " + std::to_string(reinterpret_cast<std::uintptr_t>(p)) +
          " is not 256-bit (32-byte) aligned");
  if ((ldm * sizeof(E)) % 16 != 0)
    fault(std::string(op) + ": ldm " + std::to_string(ldm) + " is not a multiple of 16 bytes");
  if (ldm < static_cast<unsigned>(row_length))
    fault(std::string(op) + ": ldm " + std::to_string(ldm) + " is shorter than a row of " +
          std::to_string(row_length) + " elements");
}

/// This warp's index in its block (threads numbered x fastest, as warps are formed).
inline unsigned warp_in_block() {
  const uint3& t = ::polyshard::emulation::thread_index();
  const dim3& b = ::polyshard::emulation::block_dim();
  return (t.x + t.y * b.x + t.z * b.x * b.y) / 32;
}

/// Where the lanes of a warp put their A and B elements for mma_sync to read: one slot a warp,
/// shared by the fibers of the block (they run on one OS thread; other OS threads have their own).
struct Exchange {
  std::array<float, 256> a, b;
};
inline Exchange& exchange() {
  static thread_local std::array<Exchange, 32> slots;  // a block has at most 32 warps
  return slots[warp_in_block()];
}

inline void warp_barrier() { ::polyshard::emulation::sync_warp(0xffffffffu); }

}  // namespace detail

/// One lane's share of a tile: 8 of its 256 elements.
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulated wmma has the m16n16k16 shape only");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>),
                "the emulated wmma multiplies half or bfloat16 tiles into float accumulators");
  static_assert(std::is_same_v<Use, accumulator> == std::is_same_v<Layout, void>,
                "matrix_a and matrix_b fragments name a layout (row_major or col_major), accumulators do not");
  using element_type = T;
  static constexpr int num_elements = 8;
  T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const T& value) {
  detail::warp_barrier();
  for (T& e : f.x) e = value;
}

namespace detail {
/// Each lane's elements of a rows x cols tile at p: (r, c) at p[r * ldm + c] (row-major) or
/// p[c * ldm + r] (column-major).
template <class F, class E>
void load(F& f, const E* p, unsigned ldm, bool row_major_memory, int rows_, int cols_) {
  check_memory<E>("load_matrix_sync", p, ldm, row_major_memory ? cols_ : rows_);
  warp_barrier();
  const unsigned lane = ::polyshard::emulation::lane_id();
  for (int i = 0; i < 8; ++i) {
    const int e = static_cast<int>(lane) * 8 + i, r = e / cols_, c = e % cols_;
    f.x[i] = row_major_memory ? p[std::size_t(r) * ldm + c] : p[std::size_t(c) * ldm + r];
  }
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator's load names its memory layout");
  detail::load(f, p, ldm, std::is_same_v<Layout, row_major>, detail::rows<Use, M, N, K>(),
               detail::cols<Use, M, N, K>());
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  detail::load(f, p, ldm, layout == mem_row_major, M, N);
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  detail::check_memory<float>("store_matrix_sync", p, ldm, layout == mem_row_major ? N : M);
  detail::warp_barrier();
  const unsigned lane = ::polyshard::emulation::lane_id();
  for (int i = 0; i < 8; ++i) {
    const int e = static_cast<int>(lane) * 8 + i, r = e / N, c = e % N;
    (layout == mem_row_major ? p[std::size_t(r) * ldm + c] : p[std::size_t(c) * ldm + r]) = f.x[i];
  }
}

/// d = a b + c, products and sums in float, each output's sum in k order from c. d may be c.
template <int M, int N, int K, class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LayoutA>& a,
              const fragment<matrix_b, M, N, K, T, LayoutB>& b, const fragment<accumulator, M, N, K, float>& c) {
  detail::Exchange& x = detail::exchange();
  const unsigned lane = ::polyshard::emulation::lane_id();
  detail::warp_barrier();  // the slot's last readers are done
  for (int i = 0; i < 8; ++i) {
    x.a[lane * 8 + i] = detail::to_float(a.x[i]);
    x.b[lane * 8 + i] = detail::to_float(b.x[i]);
  }
  detail::warp_barrier();  // every lane's elements are in
  float out[8];
  for (int i = 0; i < 8; ++i) {
    const int e = static_cast<int>(lane) * 8 + i, r = e / N, col = e % N;
    float sum = c.x[i];
    for (int k = 0; k < K; ++k) sum += x.a[r * K + k] * x.b[k * N + col];
    out[i] = sum;
  }
  for (int i = 0; i < 8; ++i) d.x[i] = out[i];
  detail::warp_barrier();  // every lane has read the slot
}

}  // namespace nvcuda::wmma
