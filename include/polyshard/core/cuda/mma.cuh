// Warp-level matrix products on tensor cores, PTX's mma.sync.aligned.m16n8k16 with half or
// bfloat16 inputs and float accumulators, for kernel sources (device code only). Unlike WMMA's
// opaque fragments, this instruction's fragments have the layout the PTX ISA documents
// ("Matrix Fragments for mma.m16n8k16 with floating point type"), which a kernel may rely on:
// the scores of a product stay in registers, row statistics are taken across the 4 lanes that
// hold a row, and an accumulator becomes the next product's A operand without leaving them.
//
// Lane l, with g = l / 4 and c = l % 4, holds:
//   A (16 x 16, row-major), 4 registers of 2 elements: a[0] = (g, 2c..2c+1), a[1] = (g+8, 2c..),
//     a[2] = (g, 2c+8..2c+9), a[3] = (g+8, 2c+8..);
//   B (16 x 8, k x n), 2 registers: b[0] = (k = 2c..2c+1, n = g), b[1] = (k = 2c+8..2c+9, n = g);
//   C and D (16 x 8, float): d[0], d[1] = (g, 2c), (g, 2c+1); d[2], d[3] = (g+8, 2c), (g+8, 2c+1).
// A register's lower 16 bits hold the element with the smaller column (A) or k (B).
//
// On the emulated device (POLYSHARD_CUDA_EMULATION) the product is computed in float from the
// same layout, as a warp-collective operation: a lane that does not take part is reported.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "polyshard/core/cuda/device_math.cuh"  // from_float, and the emulated device's built-ins

#if defined(POLYSHARD_CUDA_EMULATION)
#include <array>
#include <string>

#include "polyshard/emulation/grid.hpp"
#include "polyshard/emulation/runtime.hpp"
#endif

namespace polyshard::cuda {

struct MmaA {
  std::uint32_t r[4];
};
struct MmaB {
  std::uint32_t r[2];
};
struct MmaC {
  float r[4];
};

/// Two 16-bit elements in one register, `low` in the lower half.
template <class E>
__device__ __forceinline__ std::uint32_t pack2(E low, E high) {
  static_assert(sizeof(E) == 2, "pack2 packs 16-bit elements");
  std::uint16_t lo, hi;
  std::memcpy(&lo, &low, 2);
  std::memcpy(&hi, &high, 2);
  return std::uint32_t(lo) | (std::uint32_t(hi) << 16);
}

/// A register of two consecutive 16-bit elements in memory (4-byte aligned).
template <class E>
__device__ __forceinline__ std::uint32_t load2(const E* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

#if defined(POLYSHARD_CUDA_EMULATION)
namespace emulated_mma {

template <class E>
float half_to_float(std::uint16_t bits) {
  E e;
  std::memcpy(static_cast<void*>(&e), &bits, 2);  // the bits are all there is to a 16-bit float
  if constexpr (std::is_same_v<E, __half>) return __half2float(e);
  else return __bfloat162float(e);
}

/// Where the lanes of a warp put their operands: one slot a warp, shared by the fibers of the
/// block (they run on one OS thread), as the WMMA emulation does.
struct Slot {
  float a[16][16], b[16][8];
};
inline Slot& slot() {
  static thread_local std::array<Slot, 32> slots;
  const uint3& t = ::polyshard::emulation::thread_index();
  const dim3& d = ::polyshard::emulation::block_dim();
  return slots[(t.x + t.y * d.x + t.z * d.x * d.y) / 32];
}

}  // namespace emulated_mma
#endif

/// d += a b for a 16 x 16 tile a and a 16 x 8 tile b of element type E (__half or
/// __nv_bfloat16), in float; every lane of the warp calls it.
template <class E>
__device__ __forceinline__ void mma_16816(MmaC& d, const MmaA& a, const MmaB& b) {
  static_assert(std::is_same_v<E, __half> || std::is_same_v<E, __nv_bfloat16>, "mma_16816: half or bfloat16");
#if defined(POLYSHARD_CUDA_EMULATION)
  namespace emu = ::polyshard::emulation;
  emulated_mma::Slot& s = emulated_mma::slot();
  const int lane = static_cast<int>(emu::lane_id()), g = lane / 4, c = lane % 4;
  emu::sync_warp(0xffffffffu);  // the slot's last readers are done
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i % 2) * 8, col = 2 * c + (i / 2) * 8;
    s.a[row][col] = emulated_mma::half_to_float<E>(std::uint16_t(a.r[i] & 0xffffu));
    s.a[row][col + 1] = emulated_mma::half_to_float<E>(std::uint16_t(a.r[i] >> 16));
  }
  for (int i = 0; i < 2; ++i) {
    const int k = 2 * c + i * 8;
    s.b[k][g] = emulated_mma::half_to_float<E>(std::uint16_t(b.r[i] & 0xffffu));
    s.b[k + 1][g] = emulated_mma::half_to_float<E>(std::uint16_t(b.r[i] >> 16));
  }
  emu::sync_warp(0xffffffffu);  // every lane's operands are in
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i / 2) * 8, col = 2 * c + i % 2;
    float sum = d.r[i];
    for (int k = 0; k < 16; ++k) sum += s.a[row][k] * s.b[k][col];
    out[i] = sum;
  }
  for (int i = 0; i < 4; ++i) d.r[i] = out[i];
  emu::sync_warp(0xffffffffu);  // every lane has read the slot
#else
  if constexpr (std::is_same_v<E, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d.r[0]), "+f"(d.r[1]), "+f"(d.r[2]), "+f"(d.r[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d.r[0]), "+f"(d.r[1]), "+f"(d.r[2]), "+f"(d.r[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  }
#endif
}

/// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: four 8 x 8 matrices of 16-bit elements
/// from shared memory, each row 16 contiguous, 16-byte aligned bytes; lane 8i + j gives the
/// address of row j of matrix i. Lane l = 4g + c receives r[i] = (row g, columns 2c and 2c + 1)
/// of matrix i, or with TRANS (rows 2c and 2c + 1, column g): the matrix transposed.
template <bool TRANS, class E>
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const E* row) {
#if defined(POLYSHARD_CUDA_EMULATION)
  const int lane = static_cast<int>(::polyshard::emulation::lane_id()), g = lane / 4, c = lane % 4;
  if (reinterpret_cast<std::uintptr_t>(row) % 16 != 0)
    throw ::polyshard::emulation::DeviceFault{cudaErrorMisalignedAddress,
                                              "ldmatrix: lane " + std::to_string(lane) + "'s row address " +
                                                  std::to_string(reinterpret_cast<std::uintptr_t>(row)) +
                                                  " is not 16-byte aligned"};
  auto row_of = [&](int source_lane) {
    return reinterpret_cast<const E*>(
        __shfl_sync(0xffffffffu, static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(row)), source_lane));
  };
  for (int i = 0; i < 4; ++i) {
    if constexpr (TRANS) {
      const E* first = row_of(8 * i + 2 * c);
      const E* second = row_of(8 * i + 2 * c + 1);
      r[i] = pack2(first[g], second[g]);
    } else {
      r[i] = load2(row_of(8 * i + g) + 2 * c);
    }
  }
#else
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
#endif
}

/// The A fragment of rows [0, 16) and columns [0, 16) of a row-major tile in shared memory at p
/// (ld elements between rows, a multiple of 8; p 16-byte aligned).
template <class E>
__device__ __forceinline__ MmaA load_a(const E* p, int ld, int lane) {
  MmaA a;
  ldmatrix_x4<false>(a.r, p + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8);
  return a;
}

/// The B fragments of two neighbouring 16 x 8 tiles (k in [0, 16), n in [0, 8) and [8, 16)) of
/// a tile in shared memory stored n-major, element (k, n) at p[n * ld + k] (the rows of K for
/// scores q k^T): b[0] for n in [0, 8), b[1] for [8, 16).
template <class E>
__device__ __forceinline__ void load_b_pair_n_major(MmaB (&b)[2], const E* p, int ld, int lane) {
  std::uint32_t r[4];
  ldmatrix_x4<false>(r, p + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8);
  b[0] = {{r[0], r[1]}};
  b[1] = {{r[2], r[3]}};
}

/// As load_b_pair_n_major, of a tile stored k-major, element (k, n) at p[k * ld + n] (the rows
/// of V for probabilities times values): loaded transposed.
template <class E>
__device__ __forceinline__ void load_b_pair_k_major(MmaB (&b)[2], const E* p, int ld, int lane) {
  std::uint32_t r[4];
  ldmatrix_x4<true>(r, p + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8);
  b[0] = {{r[0], r[1]}};
  b[1] = {{r[2], r[3]}};
}

/// Two accumulator tiles (16 x 8 each, columns [0, 8) and [8, 16)) as the A fragment of the
/// 16 x 16 tile they make, rounded to E: scores become the next product's probabilities.
template <class E>
__device__ __forceinline__ MmaA accumulators_as_a(const MmaC& left, const MmaC& right) {
  auto two = [](float x, float y) { return pack2(from_float<E>(x), from_float<E>(y)); };
  return {{two(left.r[0], left.r[1]), two(left.r[2], left.r[3]), two(right.r[0], right.r[1]),
           two(right.r[2], right.r[3])}};
}

}  // namespace polyshard::cuda
