// The emulated device's execution model (emulation/grid.hpp) and device prelude
// (emulation/device.hpp): barriers, warp intrinsics, atomics and rounding intrinsics against
// oracles computed on the host from the CUDA programming guide, the launch limits, and the
// faults a GPU would turn into a hang or garbage.
#ifndef POLYSHARD_CUDA_EMULATION
#define POLYSHARD_CUDA_EMULATION
#endif
#include "polyshard/emulation/device.hpp"
// After the prelude, as the kernel sources see it.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "polyshard/core/cuda/async_copy.cuh"
#include "polyshard/core/cuda/device_math.cuh"
#include "polyshard/emulation/grid.hpp"
#include "polyshard/emulation/runtime.hpp"
#include "fault_of.hpp"

namespace emu = polyshard::emulation;
using Catch::Matchers::Contains;

namespace {

CATCH_TRANSLATE_EXCEPTION(const emu::DeviceFault& f) { return "DeviceFault: " + f.message; }

emu::LaunchShape shape_of(dim3 grid, dim3 block, std::size_t shared = 0) {
  return emu::LaunchShape{grid, block, shared};
}

using polyshard::emulation::test::fault_of;

unsigned linear_thread() { return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y; }
unsigned linear_block() { return blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y; }

}  // namespace

// ---- barriers and shared memory ------------------------------------------------------------------

TEST_CASE("grid: a block reduction through __shared__ memory and __syncthreads()", "[emulation][grid]") {
  // Tree sums over blockDim threads, not a multiple of 32 nor a power of two: each level reads
  // what other threads wrote before the barrier, so a barrier that does not wait shows.
  const unsigned threads = GENERATE(1u, 33u, 100u, 255u, 1000u, 1024u);
  const unsigned blocks = 5;
  std::vector<long long> out(blocks, -1);
  emu::run_grid("block_reduce", shape_of(dim3(blocks), dim3(threads)), [&] {
    __shared__ long long partial[1024];
    const unsigned t = threadIdx.x, n = blockDim.x;
    partial[t] = static_cast<long long>(blockIdx.x) * 100000 + t * t;
    __syncthreads();
    for (unsigned step = 1; step < n; step *= 2) {
      if (t % (2 * step) == 0 && t + step < n) partial[t] += partial[t + step];
      __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = partial[0];
  });
  for (unsigned b = 0; b < blocks; ++b) {
    long long expected = 0;
    for (unsigned t = 0; t < threads; ++t) expected += static_cast<long long>(b) * 100000 + t * t;
    CHECK(out[b] == expected);
  }
}

TEST_CASE("grid: __shared__ is one object per block, seen by all its threads", "[emulation][grid]") {
  std::vector<int> seen(4 * 64, -1);
  emu::run_grid("shared_per_block", shape_of(dim3(4), dim3(64)), [&] {
    __shared__ int value;
    if (threadIdx.x == 63) value = 1000 + static_cast<int>(blockIdx.x);
    __syncthreads();
    seen[blockIdx.x * 64 + threadIdx.x] = value;
    __syncthreads();  // nobody overwrites `value` while another thread of the block reads it
  });
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 64; ++t) CHECK(seen[b * 64 + t] == 1000 + b);
}

TEST_CASE("grid: dynamic shared memory is 16-aligned, per block and 0xFF at every block's start", "[emulation][grid]") {
  constexpr std::size_t bytes = 4096;
  std::vector<int> unwritten_is_nan(3, 0), aligned(3, 0), sums(3, 0);
  emu::run_grid("dynamic_shared", shape_of(dim3(3), dim3(128), bytes), [&] {
    POLYSHARD_DYNAMIC_SHARED(float, buf);
    const unsigned t = threadIdx.x;
    if (t == 0) {
      aligned[blockIdx.x] = reinterpret_cast<std::uintptr_t>(buf) % 16 == 0;
      // The previous block wrote every float; it must not show here.
      bool all_nan = true;
      for (std::size_t i = 0; i < bytes / sizeof(float); ++i) all_nan = all_nan && std::isnan(buf[i]);
      const auto* raw = reinterpret_cast<const unsigned char*>(buf);
      unwritten_is_nan[blockIdx.x] = all_nan && raw[0] == 0xFF && raw[bytes - 1] == 0xFF;
    }
    __syncthreads();
    for (std::size_t i = t; i < bytes / sizeof(float); i += blockDim.x) buf[i] = static_cast<float>(blockIdx.x);
    __syncthreads();
    if (t == 0) sums[blockIdx.x] = static_cast<int>(buf[0] + buf[bytes / sizeof(float) - 1]);
  });
  for (int b = 0; b < 3; ++b) {
    CHECK(unwritten_is_nan[b] == 1);
    CHECK(aligned[b] == 1);
    CHECK(sums[b] == 2 * b);
  }
}

TEST_CASE("grid: static shared memory (POLYSHARD_SHARED) is 0xFF at every block's start, and poisoned once a block",
          "[emulation][grid]") {
  std::vector<int> unwritten_is_nan(3, 0), kept(3, 0), seen(3 * 64, -1);
  emu::run_grid("static_shared", shape_of(dim3(3), dim3(64)), [&] {
    POLYSHARD_SHARED(float, buf, [64]);
    const unsigned t = threadIdx.x;
    if (t == 0) {
      // The previous block wrote every float; a GPU's shared memory would hold garbage.
      bool all_nan = true;
      for (float x : buf) all_nan = all_nan && std::isnan(x);
      const auto* raw = reinterpret_cast<const unsigned char*>(buf);
      unwritten_is_nan[blockIdx.x] = all_nan && raw[0] == 0xFF && raw[sizeof(buf) - 1] == 0xFF;
      buf[0] = -7;  // before the other threads reach the declaration: it must not poison again
    }
    __syncthreads();
    if (t == 5) kept[blockIdx.x] = buf[0] == -7;
    __syncthreads();
    buf[t] = static_cast<float>(blockIdx.x * 100 + t);
    __syncthreads();
    seen[blockIdx.x * 64 + t] = static_cast<int>(buf[63 - t]);
  });
  for (int b = 0; b < 3; ++b) {
    CHECK(unwritten_is_nan[b] == 1);
    CHECK(kept[b] == 1);
    for (int t = 0; t < 64; ++t) CHECK(seen[b * 64 + t] == b * 100 + 63 - t);
  }
}

TEST_CASE("grid: cp.async copies land at the wait that covers their group, not before", "[emulation][grid]") {
  // Each of 32 threads copies 16 bytes of its own in three groups: a value, zeros (a dead
  // source), and a second value; what shared memory holds is read between the waits.
  std::vector<std::int32_t> global(32 * 4 * 2);
  std::iota(global.begin(), global.end(), 1000);
  std::vector<int> before_wait(32, 0), after_first(32, 0), zero_after_second(32, 0), after_all(32, 0);
  emu::run_grid("copy_async", shape_of(dim3(1), dim3(32)), [&] {
    POLYSHARD_SHARED(std::int32_t, tile, [32 * 4 * 3]);
    const unsigned t = threadIdx.x;
    std::int32_t* mine = tile + t * 12;
    for (int i = 0; i < 12; ++i) mine[i] = -1;
    polyshard::cuda::copy_async<16>(mine, global.data() + t * 4, true);
    polyshard::cuda::copy_async_commit();
    polyshard::cuda::copy_async<16>(mine + 4, global.data(), false);
    polyshard::cuda::copy_async_commit();
    polyshard::cuda::copy_async<16>(mine + 8, global.data() + 128 + t * 4, true);
    polyshard::cuda::copy_async_commit();
    before_wait[t] = mine[0] == -1 && mine[4] == -1 && mine[8] == -1;
    polyshard::cuda::copy_async_wait<2>();  // the first group only
    after_first[t] = mine[0] == std::int32_t(1000 + t * 4) && mine[3] == std::int32_t(1003 + t * 4) && mine[4] == -1;
    polyshard::cuda::copy_async_wait<1>();
    zero_after_second[t] = mine[4] == 0 && mine[7] == 0 && mine[8] == -1;
    polyshard::cuda::copy_async_wait<0>();
    after_all[t] = mine[8] == std::int32_t(1128 + t * 4) && mine[11] == std::int32_t(1131 + t * 4);
  });
  // After each thread's wait and a barrier, every thread sees the others' copies.
  std::vector<std::int32_t> out(32, 0);
  emu::run_grid("copy_async_shared", shape_of(dim3(1), dim3(32)), [&] {
    POLYSHARD_SHARED(std::int32_t, cell, [32]);
    polyshard::cuda::copy_async<4>(cell + threadIdx.x, global.data() + threadIdx.x, true);
    polyshard::cuda::copy_async_commit();
    polyshard::cuda::copy_async_wait<0>();
    __syncthreads();
    out[threadIdx.x] = cell[31 - threadIdx.x];
  });
  for (unsigned t = 0; t < 32; ++t) {
    INFO("thread " << t);
    CHECK(before_wait[t] == 1);
    CHECK(after_first[t] == 1);
    CHECK(zero_after_second[t] == 1);
    CHECK(after_all[t] == 1);
    CHECK(out[t] == std::int32_t(1000 + 31 - t));
  }
}

TEST_CASE("grid: 2D and 3D blocks and grids number threads x fastest, lanes by linear index", "[emulation][grid]") {
  const dim3 block = GENERATE(dim3(8, 4, 2), dim3(5, 3, 1), dim3(3, 5, 7), dim3(1, 1, 64), dim3(32, 32, 1));
  const dim3 grid = GENERATE(dim3(3, 2, 2), dim3(1, 1, 1), dim3(2, 1, 3));
  const unsigned per_block = block.x * block.y * block.z;
  const unsigned total = per_block * grid.x * grid.y * grid.z;
  std::vector<int> visits(total, 0);
  std::vector<unsigned> lanes(total, 99);
  int bad_dims = 0;
  emu::run_grid("index_arithmetic", shape_of(grid, block), [&] {
    if (blockDim.x != block.x || blockDim.y != block.y || blockDim.z != block.z || gridDim.x != grid.x ||
        gridDim.y != grid.y || gridDim.z != grid.z || threadIdx.x >= block.x || threadIdx.y >= block.y ||
        threadIdx.z >= block.z || blockIdx.x >= grid.x || blockIdx.y >= grid.y || blockIdx.z >= grid.z)
      ++bad_dims;
    const unsigned i = linear_block() * per_block + linear_thread();
    ++visits[i];
    lanes[i] = emu::lane_id();
  });
  CHECK(bad_dims == 0);
  for (unsigned i = 0; i < total; ++i) {
    CHECK(visits[i] == 1);
    CHECK(lanes[i] == i % per_block % 32);
  }
}

// ---- warp intrinsics -----------------------------------------------------------------------------

namespace {

enum class Shuffle { idx, up, down, bfly };

// The CUDA programming guide's description of each shuffle, written out with division and modulo
// over segments of `width` lanes: which lane's value lane `lane` receives.
int expected_source(Shuffle kind, int lane, int arg, int width) {
  const int segment = lane / width * width;  // first lane of the caller's segment
  switch (kind) {
    case Shuffle::idx:  // srcLane outside [0, width) wraps within the segment
      return segment + ((arg % width) + width) % width;
    case Shuffle::up:  // no wrap: the lowest `delta` lanes of a segment keep their value
      return lane - segment >= arg ? lane - arg : lane;
    case Shuffle::down:
      return lane - segment + arg < width ? lane + arg : lane;
    case Shuffle::bfly: {  // may read an earlier segment, never a later one
      const int s = lane ^ arg;
      return s < segment + width ? s : lane;
    }
  }
  return -1;
}

template <class T>
T from_int(int v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(static_cast<float>(v));
  else
    return static_cast<T>(v);
}
template <class T>
long long to_int(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return static_cast<long long>(__half2float(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return static_cast<long long>(__bfloat162float(v));
  else
    return static_cast<long long>(v);
}

template <class T>
T shuffle(Shuffle kind, T v, int arg, int width) {
  switch (kind) {
    case Shuffle::idx:
      return __shfl_sync(0xffffffffu, v, arg, width);
    case Shuffle::up:
      return __shfl_up_sync(0xffffffffu, v, static_cast<unsigned>(arg), width);
    case Shuffle::down:
      return __shfl_down_sync(0xffffffffu, v, static_cast<unsigned>(arg), width);
    case Shuffle::bfly:
      return __shfl_xor_sync(0xffffffffu, v, arg, width);
  }
  return v;
}

}  // namespace

TEMPLATE_TEST_CASE("grid: shuffles deliver the source lane's value, or the caller's own out of range",
                   "[emulation][grid]", int, unsigned, long long, float, double, __half, __nv_bfloat16) {
  const Shuffle kind = GENERATE(Shuffle::idx, Shuffle::up, Shuffle::down, Shuffle::bfly);
  const int width = GENERATE(32, 16, 8);
  // In range, at the edge and beyond it: srcLane wraps; deltas past the segment keep the own
  // value; xor masks reaching into a later segment (16, 24 at width 8) keep it too.
  const int arg = GENERATE(0, 1, 3, 5, 7, 8, 16, 24, 31, 37, 63);
  constexpr unsigned warps = 2;
  std::vector<long long> got(32 * warps, -1);
  emu::run_grid("shuffle", shape_of(dim3(1), dim3(32 * warps)), [&] {
    const int t = static_cast<int>(threadIdx.x);
    // Values that every type holds exactly (bf16 has 8 significant bits).
    got[t] = to_int(shuffle(kind, from_int<TestType>(t * 2 + 1), arg, width));
  });
  for (int t = 0; t < static_cast<int>(32 * warps); ++t) {
    const int lane = t % 32, warp = t / 32;
    INFO("kind " << static_cast<int>(kind) << " width " << width << " arg " << arg << " thread " << t);
    CHECK(got[t] == (warp * 32 + expected_source(kind, lane, arg, width)) * 2 + 1);
  }
}

TEST_CASE("grid: a shuffle over part of a warp reads only the lanes of its mask", "[emulation][grid]") {
  // Lanes 0-15 exchange among themselves while lanes 16-31 do something else; a source lane
  // outside the mask gives the caller's own value.
  std::vector<int> got(32, -1);
  emu::run_grid("partial_shuffle", shape_of(dim3(1), dim3(32)), [&] {
    const int t = static_cast<int>(threadIdx.x);
    if (t < 16)
      got[t] = __shfl_sync(0x0000ffffu, t * 10, (t + 9) % 32);
    else
      got[t] = __shfl_down_sync(0xffff0000u, t * 10, 4);
  });
  for (int t = 0; t < 16; ++t) CHECK(got[t] == ((t + 9) % 32 < 16 ? (t + 9) % 32 : t) * 10);
  for (int t = 16; t < 32; ++t) CHECK(got[t] == (t + 4 < 32 ? t + 4 : t) * 10);
}

TEST_CASE("grid: ballot, any and all over whole and partial masks", "[emulation][grid]") {
  std::vector<unsigned> ballot(64), ballot_part(64);
  std::vector<int> any(64), all(64), any_none(64), all_part(64);
  emu::run_grid("votes", shape_of(dim3(1), dim3(64)), [&] {
    const unsigned t = threadIdx.x, lane = t % 32;
    ballot[t] = __ballot_sync(0xffffffffu, lane % 3 == 0 || t == 40);
    any[t] = __any_sync(0xffffffffu, t == 45);
    any_none[t] = __any_sync(0xffffffffu, 0);
    all[t] = __all_sync(0xffffffffu, lane != 7);
    if (lane >= 8 && lane < 24) {
      ballot_part[t] = __ballot_sync(0x00ffff00u, lane % 2);
      all_part[t] = __all_sync(0x00ffff00u, lane >= 8);  // true for every lane of the mask
    }
  });
  unsigned expected[2] = {0, 0};
  for (unsigned t = 0; t < 64; ++t)
    if (t % 32 % 3 == 0 || t == 40) expected[t / 32] |= 1u << (t % 32);
  unsigned odd = 0;
  for (unsigned l = 8; l < 24; ++l)
    if (l % 2) odd |= 1u << l;
  for (unsigned t = 0; t < 64; ++t) {
    const unsigned lane = t % 32;
    CHECK(ballot[t] == expected[t / 32]);
    CHECK(any[t] == (t >= 32 ? 1 : 0));
    CHECK(any_none[t] == 0);
    CHECK(all[t] == 0);
    if (lane >= 8 && lane < 24) {
      CHECK(ballot_part[t] == odd);
      CHECK(all_part[t] == 1);
    }
  }
}

TEST_CASE("grid: device_math's warp_sum and block_sum run as written for a GPU", "[emulation][grid]") {
  const unsigned threads = GENERATE(32u, 96u, 256u, 1024u);
  std::vector<double> sums(3, -1);
  emu::run_grid("block_sum_kernel", shape_of(dim3(3), dim3(threads)), [&] {
    __shared__ double red[32];
    double v = static_cast<double>(blockIdx.x + 1) * threadIdx.x;
    v = polyshard::cuda::block_sum(v, red);
    // Every thread gets the sum; the last one reports it.
    if (threadIdx.x == blockDim.x - 1) sums[blockIdx.x] = v;
  });
  for (unsigned b = 0; b < 3; ++b) CHECK(sums[b] == (b + 1.0) * threads * (threads - 1) / 2);
}

// ---- atomics --------------------------------------------------------------------------------------

TEST_CASE("grid: atomics from every thread of a grid, and from two grids at once", "[emulation][grid]") {
  int count = 0;
  unsigned ucount = 0;
  unsigned long long wide = 0;
  float fsum = 0;
  double dsum = 0;
  int imax = -1000000, imin = 1000000;
  unsigned umax = 0;
  long long llmin = 0;
  int cas_winner = -1;
  int exch_seen = 0;
  const unsigned blocks = 40, threads = 256;  // 10240 threads a grid
  const auto body = [&] {
    const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    atomicAdd(&count, 1);
    atomicAdd(&ucount, 2u);
    atomicAdd(&wide, 3ull);
    atomicAdd(&fsum, 1.0f);  // sums up to 2^24 are exact in float
    atomicAdd(&dsum, 0.5);
    atomicMax(&imax, (g * 7919) % 10007 - 5000);
    atomicMin(&imin, (g * 7919) % 10007 - 5000);
    atomicMax(&umax, static_cast<unsigned>(g));
    atomicMin(&llmin, -static_cast<long long>(g) * 1000000000LL);
    atomicCAS(&cas_winner, -1, g);  // the first thread to get here wins; the rest see its id
    if (atomicExch(&exch_seen, 1) == 0) atomicAdd(&count, 1000000);  // exactly one thread sees 0
  };
  // Two OS threads run the grid at once, as two streams would.
  std::thread other([&] { emu::run_grid("atomics", shape_of(dim3(blocks), dim3(threads)), body); });
  emu::run_grid("atomics", shape_of(dim3(blocks), dim3(threads)), body);
  other.join();
  const long long n = 2LL * blocks * threads;
  CHECK(count == n + 1000000);
  CHECK(ucount == 2 * n);
  CHECK(wide == 3ull * n);
  CHECK(fsum == static_cast<float>(n));
  CHECK(dsum == 0.5 * n);
  int hi = -1000000, lo = 1000000;
  for (long long g = 0; g < blocks * threads; ++g) {
    hi = std::max(hi, static_cast<int>((g * 7919) % 10007 - 5000));
    lo = std::min(lo, static_cast<int>((g * 7919) % 10007 - 5000));
  }
  CHECK(imax == hi);
  CHECK(imin == lo);
  CHECK(umax == blocks * threads - 1);
  CHECK(llmin == -static_cast<long long>(blocks * threads - 1) * 1000000000LL);
  CHECK(cas_winner >= 0);
  CHECK(cas_winner < static_cast<int>(blocks * threads));
}

TEST_CASE("grid: atomics return the old value", "[emulation][grid]") {
  int i = 5;
  CHECK(atomicAdd(&i, 3) == 5);
  CHECK(atomicExch(&i, 11) == 8);
  CHECK(atomicCAS(&i, 10, 20) == 11);  // no swap: 11 != 10
  CHECK(i == 11);
  CHECK(atomicCAS(&i, 11, 20) == 11);
  CHECK(i == 20);
  CHECK(atomicMax(&i, 15) == 20);
  CHECK(i == 20);
  CHECK(atomicMin(&i, 15) == 20);
  CHECK(i == 15);
  float f = 1.5f;
  CHECK(atomicAdd(&f, 2.0f) == 1.5f);
  CHECK(atomicExch(&f, -1.0f) == 3.5f);
  CHECK(f == -1.0f);
}

// ---- rounding intrinsics ------------------------------------------------------------------------

TEST_CASE("grid: the _rn intrinsics round each operation once, as host float arithmetic does", "[emulation][grid]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
  for (int k = 0; k < 2000; ++k) {
    // volatile: the host oracle itself must not be contracted or kept in wider registers.
    volatile float a = dist(rng), b = dist(rng), c = dist(rng);
    volatile float sum = a + b, diff = a - b, prod = a * b, quot = a / b, root = std::sqrt(std::fabs(a));
    CHECK(__fadd_rn(a, b) == sum);
    CHECK(__fsub_rn(a, b) == diff);
    CHECK(__fmul_rn(a, b) == prod);
    CHECK(__fdiv_rn(a, b) == quot);
    CHECK(__fsqrt_rn(std::fabs(a)) == root);
    CHECK(__fmaf_rn(a, b, c) == std::fma(static_cast<float>(a), static_cast<float>(b), static_cast<float>(c)));
  }
}

namespace {
// Built for a CPU with FMA, so that g++ (whose default for C++ is -ffp-contract=fast) would fuse a
// plain a * b + c here: the intrinsics must still round the product before the sum, as nvcc's do.
[[gnu::target("fma"), gnu::noinline]] float mul_then_add(float a, float b, float c) {
  return __fadd_rn(__fmul_rn(a, b), c);
}
[[gnu::target("fma"), gnu::noinline]] float plain_mul_into_add(float a, float b, float c) {
  return __fadd_rn(a * b, c);  // nvcc never fuses into __fadd_rn either
}
}  // namespace

TEST_CASE("grid: __fadd_rn(__fmul_rn(a, b), c) is never fused into an FMA", "[emulation][grid]") {
  if (!__builtin_cpu_supports("fma")) {
    WARN("this CPU has no FMA instruction: nothing to fuse");
    return;
  }
  // a * b = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11, so the rounded result is 0; fused, 2^-24.
  // volatile: the compiler must not fold the constants, which it would round correctly.
  volatile float a = 1.0f + std::ldexp(1.0f, -12), c = -(1.0f + std::ldexp(1.0f, -11));
  CHECK(std::fma(static_cast<float>(a), static_cast<float>(a), static_cast<float>(c)) == std::ldexp(1.0f, -24));
  CHECK(mul_then_add(a, a, c) == 0.0f);
  CHECK(plain_mul_into_add(a, a, c) == 0.0f);
}

TEST_CASE("grid: bit reinterpretation", "[emulation][grid]") {
  CHECK(std::isnan(__int_as_float(0x7fc00000)));
  CHECK(__float_as_int(1.0f) == 0x3f800000);
  CHECK(__uint_as_float(0x40000000u) == 2.0f);
  CHECK(__float_as_uint(-0.0f) == 0x80000000u);
  CHECK(__double_as_longlong(__longlong_as_double(0x400921fb54442d18LL)) == 0x400921fb54442d18LL);
  int4 src{1, 2, 3, 4}, dst{};
  __stwb(&dst, __ldg(&src));
  CHECK((dst.x == 1 && dst.y == 2 && dst.z == 3 && dst.w == 4));
}

// ---- launch limits --------------------------------------------------------------------------------

TEST_CASE("grid: check_launch_shape holds each extent to an sm_90 GPU's limit", "[emulation][grid]") {
  CHECK(emu::check_launch_shape(shape_of(dim3(1), dim3(1))).empty());
  CHECK(emu::check_launch_shape(shape_of(dim3(0x7fffffffu, 65535, 65535), dim3(1024))).empty());
  CHECK(emu::check_launch_shape(shape_of(dim3(1), dim3(16, 1, 64))).empty());
  CHECK(emu::check_launch_shape(shape_of(dim3(1), dim3(1, 1024, 1))).empty());
  CHECK(emu::check_launch_shape(shape_of(dim3(1), dim3(32), 48 * 1024)).empty());

  CHECK(emu::check_launch_shape(shape_of(dim3(1), dim3(2048))) == "block (2048, 1, 1) has 2048 threads; at most 1024");
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1), dim3(1, 1025, 1))), Contains("1025 threads; at most 1024"));
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1), dim3(32, 32, 2))),
             Contains("block (32, 32, 2) has 2048 threads; at most 1024"));
  CHECK(emu::check_launch_shape(shape_of(dim3(1), dim3(1, 1, 65))) == "block (1, 1, 65): z is 65; at most 64");
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1), dim3(0, 1, 1))), Contains("block (0, 1, 1): x is 0"));
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1), dim3(4, 0, 1))), Contains("block (4, 0, 1): y is 0"));
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1), dim3(4, 1, 0))), Contains("block (4, 1, 0): z is 0"));
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(0, 1, 1), dim3(32))), Contains("grid (0, 1, 1): x is 0"));
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1, 0, 1), dim3(32))), Contains("grid (1, 0, 1): y is 0"));
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1, 1, 0), dim3(32))), Contains("grid (1, 1, 0): z is 0"));
  CHECK(emu::check_launch_shape(shape_of(dim3(0x80000000u), dim3(32))) ==
        "grid (2147483648, 1, 1): x is 2147483648; at most 2147483647");
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1, 65536, 1), dim3(32))), Contains("y is 65536; at most 65535"));
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1, 1, 65536), dim3(32))), Contains("z is 65536; at most 65535"));
  CHECK_THAT(emu::check_launch_shape(shape_of(dim3(1), dim3(32), 48 * 1024 + 1)),
             Contains("dynamic shared memory of 49153 bytes; at most 49152 (48 KiB) without cudaFuncSetAttribute"));
  // With the kernel's limit raised (cudaFuncSetAttribute; the launch reads it per device).
  CHECK(emu::check_launch_shape(emu::LaunchShape{dim3(1), dim3(32), 100000, 100000}).empty());
  CHECK_THAT(emu::check_launch_shape(emu::LaunchShape{dim3(1), dim3(32), 100001, 100000}),
             Contains("dynamic shared memory of 100001 bytes; at most 100000 (the kernel's"));
}

TEST_CASE("grid: run_grid refuses a shape the GPU would refuse", "[emulation][grid]") {
  bool ran = false;
  try {
    emu::run_grid("too_wide", shape_of(dim3(1), dim3(2048)), [&] { ran = true; });
    FAIL("no DeviceFault");
  } catch (const emu::DeviceFault& f) {
    CHECK(f.code == cudaErrorInvalidConfiguration);
    CHECK(f.message == "kernel too_wide: block (2048, 1, 1) has 2048 threads; at most 1024");
  }
  CHECK_FALSE(ran);
}

// ---- faults ---------------------------------------------------------------------------------------

TEST_CASE("grid: a __syncthreads() that one thread skips is a fault naming kernel, block and thread",
          "[emulation][grid]") {
  const std::string message = fault_of([] {
    emu::run_grid("set_all_kernel<float>", shape_of(dim3(3), dim3(256)), [] {
      if (blockIdx.x == 1 && threadIdx.x == 17) return;
      __syncthreads();
    });
  });
  CHECK(message ==
        "kernel set_all_kernel<float>: __syncthreads() in block (1,0,0) reached by 255 of 256 threads; thread (17,0,0) "
        "returned without reaching it");
}

TEST_CASE("grid: threads that wait at different barriers' counts are caught at the last one", "[emulation][grid]") {
  // Thread 0 passes one barrier fewer than the rest: on a GPU the barriers pair up wrongly.
  const std::string message = fault_of([] {
    emu::run_grid("uneven", shape_of(dim3(1), dim3(2, 2, 1)), [] {
      __syncthreads();
      if (threadIdx.x == 0 && threadIdx.y == 0) return;
      __syncthreads();
    });
  });
  CHECK(message ==
        "kernel uneven: __syncthreads() in block (0,0,0) reached by 3 of 4 threads; thread (0,0,0) returned without "
        "reaching it");
}

TEST_CASE("grid: a full-mask shuffle in a partial warp names the lanes that do not exist", "[emulation][grid]") {
  const std::string message = fault_of([] {
    emu::run_grid("partial_warp", shape_of(dim3(1), dim3(48)), [] { (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1); });
  });
  CHECK_THAT(message, Contains("kernel partial_warp: "));
  CHECK_THAT(message, Contains("block (0,0,0), warp 1"));
  CHECK_THAT(message, Contains("lanes 16-31 do not exist (the block has 48 threads)"));
}

TEST_CASE("grid: warp intrinsics whose lanes returned, disagree or wait elsewhere are faults", "[emulation][grid]") {
  SECTION("lanes that returned") {
    const std::string message = fault_of([] {
      emu::run_grid("early_exit", shape_of(dim3(2), dim3(64)), [] {
        const unsigned lane = threadIdx.x % 32;
        if (blockIdx.x == 1 && threadIdx.x >= 32 && (lane == 3 || lane == 9 || lane == 10)) return;
        __syncwarp();
      });
    });
    CHECK(message ==
          "kernel early_exit: __syncwarp() with mask 0xffffffff in block (1,0,0), warp 1: lanes 3, 9-10 returned "
          "without reaching it");
  }
  SECTION("different masks") {
    const std::string message = fault_of([] {
      emu::run_grid("masks", shape_of(dim3(1), dim3(32)),
                    [] { (void)__ballot_sync(threadIdx.x == 5 ? 0x0000ffffu : 0xffffffffu, 1); });
    });
    CHECK_THAT(message, Contains("kernel masks: "));
    CHECK_THAT(message, Contains("lane 5 (thread (5,0,0)) waits at"));
    CHECK_THAT(message, Contains("with mask 0x0000ffff instead"));
  }
  SECTION("a mask without the calling lane") {
    const std::string message = fault_of(
        [] { emu::run_grid("self", shape_of(dim3(1), dim3(32)), [] { (void)__shfl_sync(0x0000ffffu, 1, 0); }); });
    CHECK_THAT(message, Contains("the mask does not name the calling lane 16"));
  }
  SECTION("a lane at the block barrier") {
    const std::string message = fault_of([] {
      emu::run_grid("deadlock", shape_of(dim3(1), dim3(64)), [] {
        if (threadIdx.x == 40)
          __syncthreads();
        else
          (void)__shfl_sync(0xffffffffu, 1, 0);
        __syncthreads();
      });
    });
    // Warp 0 shuffles and goes on to the barrier; warp 1 waits for its lane 8 (thread 40).
    CHECK(message ==
          "kernel deadlock: __syncthreads() in block (0,0,0) reached by 33 of 64 threads; thread (32,0,0) waits at a "
          "__shfl*_sync() (warp 1, mask 0xffffffff) for lane 8, which waits at the barrier");
  }
  SECTION("a width that is not a power of two") {
    const std::string message = fault_of([] {
      emu::run_grid("width", shape_of(dim3(1), dim3(32)), [] { (void)__shfl_down_sync(0xffffffffu, 1, 1, 12); });
    });
    CHECK_THAT(message, Contains("kernel width: thread (0,0,0) of block (0,0,0) faulted: shuffle width 12"));
  }
}

TEST_CASE("grid: an exception from the kernel body is a fault naming the kernel and the thread", "[emulation][grid]") {
  try {
    emu::run_grid("assert_kernel", shape_of(dim3(4), dim3(2, 32)), [] {
      __syncthreads();
      if (blockIdx.x == 2 && threadIdx.x == 1 && threadIdx.y == 30) throw std::runtime_error("index out of range");
      __syncthreads();
    });
    FAIL("no DeviceFault");
  } catch (const emu::DeviceFault& f) {
    CHECK(f.code == cudaErrorAssert);
    CHECK(f.message == "kernel assert_kernel: thread (1,30,0) of block (2,0,0) threw: index out of range");
  }
}

TEST_CASE("grid: after a fault the next grid runs normally on the same fibers", "[emulation][grid]") {
  (void)fault_of([] {
    emu::run_grid("broken", shape_of(dim3(2), dim3(512)), [] {
      // Half the block waits at the barrier, half at a shuffle, one thread has left: all of them
      // are unwound before run_grid throws.
      if (threadIdx.x == 0) return;
      if (threadIdx.x < 256)
        __syncthreads();
      else
        (void)__shfl_sync(0xffffffffu, 1, 0);
    });
  });
  const std::size_t stacks = emu::pooled_fiber_stacks();
  std::vector<int> out(512, 0);
  emu::run_grid("after", shape_of(dim3(1), dim3(512)), [&] {
    __shared__ int s[512];
    s[threadIdx.x] = static_cast<int>(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = s[511 - threadIdx.x] + __shfl_xor_sync(0xffffffffu, 1, 1);
  });
  for (int t = 0; t < 512; ++t) CHECK(out[t] == 511 - t + 1);
  CHECK(emu::pooled_fiber_stacks() == stacks);
}

TEST_CASE("grid: the built-in variables and intrinsics outside a kernel throw", "[emulation][grid]") {
  CHECK_THROWS_AS((void)threadIdx.x, std::logic_error);
  CHECK_THROWS_AS((void)blockDim.x, std::logic_error);
  CHECK_THROWS_AS(__syncthreads(), std::logic_error);
  CHECK_THROWS_AS(__shfl_sync(0xffffffffu, 1, 0), std::logic_error);
}

TEST_CASE("grid: a kernel that launches a grid is refused", "[emulation][grid]") {
  const std::string message = fault_of([] {
    emu::run_grid("outer", shape_of(dim3(1), dim3(32)),
                  [] { emu::run_grid("inner", shape_of(dim3(1), dim3(32)), [] {}); });
  });
  CHECK_THAT(message, Contains("kernel inner: launched from inside a running kernel"));
}

// ---- fibers -------------------------------------------------------------------------------------

namespace {
/// The process's virtual memory size in bytes (Linux).
std::size_t virtual_memory_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0;
  statm >> pages;
  return pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}
}  // namespace

TEST_CASE("grid: fiber stacks are reused: a million-thread grid does not grow memory", "[emulation][grid]") {
  std::atomic<long long> sum{0};
  const auto clean = [&] {
    const unsigned t = threadIdx.x;
    __syncthreads();
    const int last = __shfl_sync(0xffffffffu, static_cast<int>(t), 31);
    if (t % 32 == 0) sum += last;
  };
#if defined(__SANITIZE_THREAD__)
  // Under ThreadSanitizer every access and atomic of the body is checked: 2^15 threads still
  // show a per-thread stack as 2^15 stacks.
  constexpr unsigned blocks = 32;
#else
  constexpr unsigned blocks = 1024;  // 2^20 threads
#endif
  emu::run_grid("warm_up", shape_of(dim3(2), dim3(1024)), clean);
  const std::size_t stacks = emu::pooled_fiber_stacks();
  const std::size_t before = virtual_memory_bytes();
  sum = 0;
  emu::run_grid("million", shape_of(dim3(blocks), dim3(1024)), clean);
  // Lane 0 of warp w adds lane 31's thread index, 32 w + 31: 16864 a block.
  CHECK(sum == blocks * 16864LL);
  CHECK(emu::pooled_fiber_stacks() == stacks);
  CHECK(stacks <= 1024);
  // A stack per thread would be 2^20 * 64 KiB of address space.
  CHECK(virtual_memory_bytes() < before + (64u << 20));
}

TEST_CASE("grid: grids with barriers run on two OS threads at once", "[emulation][grid]") {
  // Two streams' grids: each OS thread has its own fibers and its own __shared__ objects.
  const auto run = [](int seed, long long* result) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<long long> out(8, 0);
      emu::run_grid("twin", shape_of(dim3(8), dim3(128)), [&] {
        __shared__ long long partial[128];
        const unsigned t = threadIdx.x;
        partial[t] = seed + t + blockIdx.x;
        __syncthreads();
        for (unsigned s = 64; s > 0; s /= 2) {
          if (t < s) partial[t] += partial[t + s];
          __syncthreads();
        }
        if (t == 0) out[blockIdx.x] = partial[0];
      });
      *result += std::accumulate(out.begin(), out.end(), 0LL);
    }
  };
  long long a = 0, b = 0;
  std::thread other(run, 1000, &b);
  run(0, &a);
  other.join();
  const long long per_grid_0 = 8 * (127 * 128 / 2) + 128 * (7 * 8 / 2);  // sum of t + blockIdx
  CHECK(a == 20 * per_grid_0);
  CHECK(b == 20 * (per_grid_0 + 8 * 128 * 1000LL));
}

// ---- the launcher's compile-time parts ------------------------------------------------------------

namespace polyshard::cuda {
namespace {
template <class T>
__global__ void set_all_kernel(T* out, std::int64_t n, T value) {
  // One element per thread: the grid covers n.
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}
}  // namespace
}  // namespace polyshard::cuda

namespace {
// Compiled, never called here: launch<>() needs the runtime (test_runtime.cpp runs it).
[[maybe_unused]] inline void launch_compiles(float* p, cudaStream_t s) {
  polyshard::emulation::launch<polyshard::cuda::set_all_kernel<float>>(dim3(4), dim3(256), 0, s, p, 1000, 2.5);
}
}  // namespace

TEST_CASE("grid: kernel names come from the launch's template argument", "[emulation][grid]") {
  CHECK(emu::kernel_name<polyshard::cuda::set_all_kernel<float>>() == "set_all_kernel<float>");
  CHECK(emu::kernel_name<polyshard::cuda::set_all_kernel<__half>>() == "set_all_kernel<__half>");
  CHECK(emu::detail::kernel_name_from("std::string_view f() [with auto K = a::b<c<1>, d[2]>; x = y]") ==
        "a::b<c<1>, d[2]>");
  CHECK(emu::detail::kernel_name_from("f() [with auto K = polyshard::cuda::k<(anonymous namespace)::S>]") == "k<S>");
}

TEST_CASE("grid: a kernel runs from its parameters' copies through run_grid", "[emulation][grid]") {
  // What launch() enqueues, without the runtime: the kernel applied to converted parameters.
  std::vector<float> out(1000, 0);
  using Params = std::tuple<float*, std::int64_t, float>;
  const Params params = emu::detail::to_parameters<Params>(std::make_index_sequence<3>{}, out.data(), 1000, 2.5);
  emu::run_grid(emu::kernel_name<polyshard::cuda::set_all_kernel<float>>(), shape_of(dim3(8), dim3(128)),
                [&] { std::apply(polyshard::cuda::set_all_kernel<float>, params); });
  CHECK(std::count(out.begin(), out.end(), 2.5f) == 1000);
}
