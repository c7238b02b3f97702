// The emulated tensor-core instructions (core/cuda/mma.cuh): mma.sync m16n8k16 and ldmatrix x4,
// against the fragment layouts the PTX ISA documents, written out here independently of the
// header (an element's lane and register from its row and column), and against a product in
// double; and the faults: a misaligned ldmatrix row, a lane that skips a collective instruction.
#ifndef POLYSHARD_CUDA_EMULATION
#define POLYSHARD_CUDA_EMULATION
#endif
#include "polyshard/emulation/device.hpp"
// After the prelude, as the kernel sources see it.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "polyshard/core/cuda/mma.cuh"
#include "polyshard/emulation/grid.hpp"
#include "polyshard/emulation/runtime.hpp"
#include "fault_of.hpp"

namespace emu = polyshard::emulation;
namespace pc = polyshard::cuda;
using Catch::Matchers::Contains;

namespace {

using polyshard::emulation::test::fault_of;

template <class E>
std::uint16_t bits_of(E x) {
  std::uint16_t b;
  std::memcpy(&b, static_cast<const void*>(&x), 2);
  return b;
}

// The PTX ISA's tables for mma.m16n8k16 (.f16/.bf16, row.col, f32 accumulators), lane = 4 g + c:
// A element (row, col) is in lane 4 (row % 8) + (col % 8) / 2, register (row / 8) + 2 (col / 8),
// half col % 2; B element (k, n) in lane 4 n + (k % 8) / 2, register k / 8, half k % 2; C element
// (row, col) in lane 4 (row % 8) + col / 2, value 2 (row / 8) + col % 2.
struct Spot {
  int lane, index, half;
};
Spot a_spot(int row, int col) { return {4 * (row % 8) + (col % 8) / 2, row / 8 + 2 * (col / 8), col % 2}; }
Spot b_spot(int k, int n) { return {4 * n + (k % 8) / 2, k / 8, k % 2}; }
Spot c_spot(int row, int col) { return {4 * (row % 8) + col / 2, 2 * (row / 8) + col % 2, 0}; }

template <class E>
std::vector<E> random_matrix(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<E> v(n);
  for (E& x : v) x = E(u(rng));
  return v;
}

float as_float(__half x) { return __half2float(x); }
float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }

}  // namespace

TEMPLATE_TEST_CASE("mma_16816: d += a b from the documented fragment layouts", "[emulation][mma]", __half,
                   __nv_bfloat16) {
  using E = TestType;
  const auto a = random_matrix<E>(16 * 16, 1), b = random_matrix<E>(16 * 8, 2);
  const auto c = random_matrix<float>(16 * 8, 3);
  // Each lane's registers, filled from the tables above.
  std::vector<pc::MmaA> fa(32);
  std::vector<pc::MmaB> fb(32);
  std::vector<pc::MmaC> fc(32);
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) {
      const Spot s = a_spot(r, k);
      fa[s.lane].r[s.index] |= std::uint32_t(bits_of(a[r * 16 + k])) << (16 * s.half);
    }
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) {
      const Spot s = b_spot(k, n);
      fb[s.lane].r[s.index] |= std::uint32_t(bits_of(b[k * 8 + n])) << (16 * s.half);
    }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) fc[c_spot(r, n).lane].r[c_spot(r, n).index] = c[r * 8 + n];
  // Two warps, each its own product: the warps of a block must not share their operands.
  std::vector<pc::MmaC> d(64);
  emu::run_grid("mma_16816", emu::LaunchShape{dim3(1), dim3(64), 0}, [&] {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    pc::MmaC acc = fc[lane];
    if (warp == 1)
      for (float& x : acc.r) x += 1.0f;
    pc::mma_16816<E>(acc, fa[lane], fb[lane]);
    d[threadIdx.x] = acc;
  });
  for (int warp = 0; warp < 2; ++warp)
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n) {
        double want = c[r * 8 + n] + warp;
        for (int k = 0; k < 16; ++k) want += double(as_float(a[r * 16 + k])) * as_float(b[k * 8 + n]);
        const Spot s = c_spot(r, n);
        INFO("warp " << warp << ", element (" << r << ", " << n << ")");
        CHECK(std::abs(d[warp * 32 + s.lane].r[s.index] - want) <= 1e-5 * (1 + std::abs(want)));
      }
}

TEST_CASE("ldmatrix x4: four 8x8 matrices by rows, and transposed", "[emulation][mma]") {
  // A 16 x 24 tile with rows of 24 elements (48 bytes, 16-byte aligned); matrix i of the four
  // starts at row 8 (i % 2), column 8 (i / 2). Every element its own index (exact in half).
  alignas(16) static __half tile[16 * 24];
  for (int i = 0; i < 16 * 24; ++i) tile[i] = __float2half(float(i));
  std::vector<std::uint32_t> plain(32 * 4), transposed(32 * 4);
  emu::run_grid("ldmatrix", emu::LaunchShape{dim3(1), dim3(32), 0}, [&] {
    const int lane = int(threadIdx.x), i = lane / 8, j = lane % 8;
    const __half* row = tile + (8 * (i % 2) + j) * 24 + 8 * (i / 2);
    std::uint32_t r[4];
    pc::ldmatrix_x4<false>(r, row);
    for (int m = 0; m < 4; ++m) plain[lane * 4 + m] = r[m];
    pc::ldmatrix_x4<true>(r, row);
    for (int m = 0; m < 4; ++m) transposed[lane * 4 + m] = r[m];
  });
  auto element = [](int m, int row, int col) { return float((8 * (m % 2) + row) * 24 + 8 * (m / 2) + col); };
  auto half = [](std::uint32_t reg, int h) {
    const auto b = std::uint16_t(reg >> (16 * h));
    __half x;
    std::memcpy(static_cast<void*>(&x), &b, 2);
    return __half2float(x);
  };
  for (int lane = 0; lane < 32; ++lane)
    for (int m = 0; m < 4; ++m) {
      const int g = lane / 4, c = lane % 4;
      INFO("lane " << lane << ", matrix " << m);
      CHECK(half(plain[lane * 4 + m], 0) == element(m, g, 2 * c));
      CHECK(half(plain[lane * 4 + m], 1) == element(m, g, 2 * c + 1));
      CHECK(half(transposed[lane * 4 + m], 0) == element(m, 2 * c, g));
      CHECK(half(transposed[lane * 4 + m], 1) == element(m, 2 * c + 1, g));
    }
}

TEST_CASE("mma and ldmatrix: what the PTX ISA forbids is a fault", "[emulation][mma]") {
  alignas(16) static __half tile[16 * 16];
  CHECK_THAT(fault_of([&] {
               emu::run_grid("ldmatrix_misaligned", emu::LaunchShape{dim3(1), dim3(32), 0}, [&] {
                 std::uint32_t r[4];
                 pc::ldmatrix_x4<false>(r, tile + 16 * (threadIdx.x % 16) + (threadIdx.x == 3 ? 4 : 0));
               });
             }),
             Contains("ldmatrix") && Contains("not 16-byte aligned"));
  // A lane that skips the product leaves the warp incomplete, where a GPU would hang.
  CHECK_THAT(fault_of([&] {
               emu::run_grid("mma_divergent", emu::LaunchShape{dim3(1), dim3(32), 0}, [&] {
                 pc::MmaC d{};
                 if (threadIdx.x == 5) return;
                 pc::mma_16816<__half>(d, pc::MmaA{}, pc::MmaB{});
               });
             }),
             Contains("mma_divergent"));
}
