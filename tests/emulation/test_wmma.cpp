// The emulated WMMA API (emulation/wmma.hpp): warp-wide 16x16x16 products against a product
// computed on the host in double, every memory layout of every operand, and the faults the CUDA
// programming guide's requirements turn into (a misaligned pointer, a short ldm, a lane that
// does not take part).
#ifndef POLYSHARD_CUDA_EMULATION
#define POLYSHARD_CUDA_EMULATION
#endif
#include "polyshard/emulation/device.hpp"
// After the prelude, as the kernel sources see it.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "polyshard/core/cuda/wmma.cuh"
#include "polyshard/emulation/grid.hpp"
#include "polyshard/emulation/runtime.hpp"

namespace emu = polyshard::emulation;
namespace wmma = nvcuda::wmma;
using Catch::Matchers::Contains;

namespace {

template <class F>
std::string fault_of(F&& f) {
  try {
    f();
  } catch (const emu::DeviceFault& e) {
    return e.message;
  }
  FAIL("no DeviceFault");
  return {};
}

template <class E>
std::vector<E> random_tile(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<E> v(n);
  for (E& x : v) x = E(u(rng));
  return v;
}

}  // namespace

TEMPLATE_TEST_CASE("wmma: a warp's 16x16x16 product plus an accumulator, every layout", "[emulation][wmma]", __half,
                   __nv_bfloat16) {
  using E = TestType;
  // Two warps, each its own product: the warps of a block must not share their exchange.
  const bool a_row = GENERATE(true, false), b_row = GENERATE(true, false), c_row = GENERATE(true, false);
  constexpr unsigned ld = 24;  // row (or column) length in memory: more than 16, a multiple of 8
  alignas(32) static E a[2][16 * ld], b[2][16 * ld];
  alignas(32) static float c[2][16 * ld], d[2][16 * ld];
  for (int w = 0; w < 2; ++w) {
    const auto ra = random_tile<E>(16 * ld, 1 + w), rb = random_tile<E>(16 * ld, 3 + w);
    const auto rc = random_tile<float>(16 * ld, 5 + w);
    for (unsigned i = 0; i < 16 * ld; ++i) {
      a[w][i] = ra[i];
      b[w][i] = rb[i];
      c[w][i] = rc[i];
      d[w][i] = NAN;
    }
  }
  emu::run_grid("wmma_product", emu::LaunchShape{dim3(1), dim3(64), 0}, [&] {
    const unsigned w = threadIdx.x / 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, c[w], ld, c_row ? wmma::mem_row_major : wmma::mem_col_major);
    auto multiply = [&](auto fa, auto fb) {
      wmma::load_matrix_sync(fa, a[w], ld);
      wmma::load_matrix_sync(fb, b[w], ld);
      wmma::mma_sync(acc, fa, fb, acc);
    };
    using A_row = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major>;
    using A_col = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::col_major>;
    using B_row = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major>;
    using B_col = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major>;
    if (a_row && b_row) multiply(A_row{}, B_row{});
    if (a_row && !b_row) multiply(A_row{}, B_col{});
    if (!a_row && b_row) multiply(A_col{}, B_row{});
    if (!a_row && !b_row) multiply(A_col{}, B_col{});
    wmma::store_matrix_sync(d[w], acc, ld, wmma::mem_row_major);
  });
  auto at = [](bool row_major, unsigned r, unsigned col) { return row_major ? r * ld + col : col * ld + r; };
  for (int w = 0; w < 2; ++w)
    for (unsigned i = 0; i < 16; ++i)
      for (unsigned j = 0; j < 16; ++j) {
        double want = c[w][at(c_row, i, j)];
        for (unsigned k = 0; k < 16; ++k)
          want += double(float(a[w][at(a_row, i, k)])) * double(float(b[w][at(b_row, k, j)]));
        INFO("warp " << w << ", element (" << i << ", " << j << ")");
        CHECK(std::abs(d[w][i * ld + j] - want) <= 1e-5 * (1 + std::abs(want)));
      }
  // Only the 16 columns of each row were written.
  for (int w = 0; w < 2; ++w)
    for (unsigned i = 0; i < 16; ++i) CHECK(std::isnan(d[w][i * ld + 16]));
}

TEST_CASE("wmma: fill_fragment and elementwise use of x[] reach every element", "[emulation][wmma]") {
  alignas(32) static float out[16 * 16];
  emu::run_grid("wmma_fill", emu::LaunchShape{dim3(1), dim3(32), 0}, [&] {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 1.5f);
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= 2.0f;
    wmma::store_matrix_sync(out, acc, 16, wmma::mem_col_major);
  });
  for (float x : out) CHECK(x == 3.0f);
}

TEST_CASE("wmma: the programming guide's requirements are faults", "[emulation][wmma]") {
  alignas(32) static __nv_bfloat16 tile[32 * 32];
  alignas(32) static float floats[32 * 32];
  auto run = [](const char* name, std::function<void()> body) {
    emu::run_grid(name, emu::LaunchShape{dim3(1), dim3(32), 0}, body);
  };
  CHECK_THAT(fault_of([&] {
               run("wmma_misaligned", [&] {
                 wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> f;
                 wmma::load_matrix_sync(f, tile + 8, 32);  // 16 bytes in: not 256-bit aligned
               });
             }),
             Contains("not 256-bit") && Contains("load_matrix_sync"));
  CHECK_THAT(fault_of([&] {
               run("wmma_ldm", [&] {
                 wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> f;
                 wmma::load_matrix_sync(f, tile, 20);  // 40 bytes: not a multiple of 16
               });
             }),
             Contains("ldm 20"));
  CHECK_THAT(fault_of([&] {
               run("wmma_short_row", [&] {
                 wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
                 wmma::fill_fragment(f, 0.0f);
                 wmma::store_matrix_sync(floats, f, 8, wmma::mem_row_major);  // rows of 16 in 8
               });
             }),
             Contains("shorter than a row"));
  // A lane that skips the product leaves the warp's barrier incomplete, as a GPU would hang.
  const std::string skipped = fault_of([&] {
    run("wmma_divergent", [&] {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      if (threadIdx.x == 5) return;
      wmma::fill_fragment(a, __float2bfloat16(1.0f));
      wmma::fill_fragment(b, __float2bfloat16(1.0f));
      wmma::fill_fragment(c, 0.0f);
      wmma::mma_sync(c, a, b, c);
    });
  });
  CHECK_THAT(skipped, Contains("wmma_divergent"));
}
