// The fused causal attention kernels (flash_attention.hpp) and their launchers, instantiated for
// half and bfloat16 at head dimensions 16, 32, 64 and 128.
//
// A block owns 64 consecutive rows (queries in the forward and dq kernels, keys in the dk/dv
// kernel), 16 to each of its 4 warps, and streams tiles of the other side through shared memory
// (64 rows; 32 in the backward at head dimension 128, to keep its registers within 255). Every
// product is mma.sync m16n8k16 (core/cuda/mma.cuh), whose documented fragment layout lets a
// warp keep its strip's scores in registers: row maxima and sums are taken across the 4 lanes
// that hold a row, and the scores, once probabilities (or their gradients), are the next
// product's A operand without leaving the registers, as in FlashAttention-2. Fragments come
// from shared memory through ldmatrix (transposed where a product runs along a tile's rows).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "polyshard/core/cuda/async_copy.cuh"
#include "polyshard/core/cuda/device_math.cuh"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/cuda/mma.cuh"
#include "polyshard/core/error.hpp"
#include "polyshard/tensor/cuda/flash_attention.hpp"

namespace polyshard::cuda {
namespace flash_detail {

/// What every kernel needs of the shape, in the types the kernels index with.
struct Dims {
  int t = 0, n_head = 0, group = 1;  // sequence length; query heads; query heads per key-value head
  std::int64_t stride = 0, kv_stride = 0, out_stride = 0;  // q (and dq); k and v (and dk, dv); out
  float scale = 1.0f;       // 1 / sqrt(head_dim)
  float scale_log2 = 1.0f;  // scale * log2(e): scores in base 2, for exp2f
  bool packs = false;       // every row of q, k, v, out and dout starts 16-byte aligned
};

}  // namespace flash_detail

namespace {

using flash_detail::Dims;

constexpr float log2e = 1.4426950408889634f;
constexpr float ln2 = 0.6931471805599453f;

constexpr int warp_rows = 16;  // a warp's strip of rows: the M of every product
constexpr int block_rows = 64;  // rows a block owns (queries, or keys for dk and dv): 4 warps
constexpr int block_threads = block_rows / warp_rows * 32;
/// Rows of a streamed tile (keys in the forward and dq kernels, queries in the dk/dv kernel):
/// fewer at head dimension 128 keep the registers of the scores, their gradients and the
/// accumulators within 255, and two stages of tiles within a block's 48 KiB of shared memory.
template <int HD>
constexpr int stream_rows = HD <= 64 ? 64 : 32;
/// Row lengths in shared memory, padded by 16 bytes: rows a multiple of 128 bytes apart would put
/// the rows a warp reads at once in the same banks.
template <int N>
constexpr int padded = N + 8;

/// Rows [row0, row0 + ROWS) of one head (src: its position 0; `stride` between positions) into
/// dst, ROWS x HD with rows padded<HD> apart; rows at or past t are zero, so that they add
/// nothing to any product. With 16-byte aligned rows (`packs`) the copies are started
/// asynchronously and land at the kernel's next copy_async_wait; otherwise they are done at once.
template <class E, int HD, int ROWS>
__device__ __forceinline__ void start_tile(E* dst, const E* src, std::int64_t stride, int row0, int t, bool packs) {
  constexpr int P = Pack<E>::size, per_row = HD / P;
  if (packs) {
    // Each thread copies the same pack of every rows_per_pass-th row: its row, column and
    // addresses are worked out once, then stepped, rather than divided out of a flat index
    // per pack (integer work that competed with the products for issue slots).
    constexpr int rows_per_pass = block_threads / per_row;
    static_assert(block_threads % per_row == 0 && ROWS % rows_per_pass == 0, "whole passes over the tile");
    const int r = threadIdx.x / per_row, c = threadIdx.x % per_row * P;
    const E* from = src + std::int64_t(row0 + r) * stride + c;
    E* to = dst + r * padded<HD> + c;
    const std::int64_t step = std::int64_t(rows_per_pass) * stride;
#pragma unroll
    for (int pass = 0; pass < ROWS / rows_per_pass; ++pass) {
      const bool live = row0 + r + pass * rows_per_pass < t;
      copy_async<16>(to + pass * rows_per_pass * padded<HD>, live ? from + pass * step : src, live);
    }
    return;
  }
  for (int i = threadIdx.x; i < ROWS * per_row; i += block_threads) {
    const int r = i / per_row, c = (i % per_row) * P;
    const bool live = row0 + r < t;
    Pack<E> x;
    for (int j = 0; j < P; ++j) x.v[j] = live ? src[std::int64_t(row0 + r) * stride + c + j] : from_float<E>(0.0f);
    store_pack(dst + r * padded<HD> + c, x);
  }
}

/// Floats [row0, row0 + ROWS) of a per-row statistic (zeros at or past t) into dst, asynchronously.
template <int ROWS>
__device__ __forceinline__ void start_rows(float* dst, const float* src, int row0, int t) {
  for (int i = threadIdx.x; i < ROWS; i += block_threads) copy_async<4>(dst + i, src + (row0 + i < t ? row0 + i : 0), row0 + i < t);
}

/// The loop every kernel here runs over its streamed tiles, in two stages of shared memory: tile
/// j + 1's copies run while tile j is used. start(j, stage) starts tile j's copies into a stage;
/// use(j, stage) reads it once it has landed for the whole block. Each is called with j = 0, 1,
/// 2, ... in turn.
template <class Start, class Use>
__device__ __forceinline__ void stream_tiles(int tiles, Start&& start, Use&& use) {
  start(0, 0);
  copy_async_commit();
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles) start(j + 1, (j + 1) & 1);
    copy_async_commit();  // an empty group after the last tile keeps the wait below uniform
    copy_async_wait<1>();  // tile j has landed for this thread ...
    __syncthreads();       // ... and for every thread
    use(j, j & 1);
    __syncthreads();  // every warp is done with tile j's stage before tile j + 2 is started into it
  }
}

/// The A fragments of a warp's 16-row strip (16 x HD) of a tile in shared memory, for a loop.
template <class E, int HD>
__device__ __forceinline__ void load_strip(MmaA (&a)[HD / 16], const E* strip, int lane) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) a[kk] = load_a(strip + kk * 16, padded<HD>, lane);
}

/// acc[n] = a (16 x HD, fragments) times the transpose of the tile b (N x HD, rows padded<HD>
/// apart): a strip's scores against a tile, 16 x N in N / 8 accumulators.
template <class E, int HD, int N>
__device__ __forceinline__ void strip_scores(MmaC (&acc)[N / 8], const MmaA (&a)[HD / 16], const E* b, int lane) {
#pragma unroll
  for (int n = 0; n < N / 8; ++n) acc[n] = MmaC{};
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
      MmaB pair[2];
      load_b_pair_n_major(pair, b + n * 8 * padded<HD> + kk * 16, padded<HD>, lane);
      mma_16816<E>(acc[n], a[kk], pair[0]);
      mma_16816<E>(acc[n + 1], a[kk], pair[1]);
    }
}

/// acc[n] += p (16 x N, accumulators rounded to E) times the tile b (N x HD, rows padded<HD>
/// apart): probabilities times values, or score gradients times keys, queries or output
/// gradients.
template <class E, int HD, int N>
__device__ __forceinline__ void accumulate_product(MmaC (&acc)[HD / 8], const MmaC (&p)[N / 8], const E* b, int lane) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    const MmaA a = accumulators_as_a<E>(p[2 * kk], p[2 * kk + 1]);
#pragma unroll
    for (int n = 0; n < HD / 8; n += 2) {
      MmaB pair[2];
      load_b_pair_k_major(pair, b + kk * 16 * padded<HD> + n * 8, padded<HD>, lane);
      mma_16816<E>(acc[n], a, pair[0]);
      mma_16816<E>(acc[n + 1], a, pair[1]);
    }
  }
}

/// Writes (or adds) a warp's 16 x HD strip of accumulators, times factor[0] in its first 8 rows
/// and factor[1] in the others, to rows row0.. of one head (dst: its position 0); rows at or
/// past t are not written.
template <class E, int HD>
__device__ __forceinline__ void write_strip(const MmaC (&acc)[HD / 8], E* dst, std::int64_t stride, int row0, int t,
                                            const float (&factor)[2], bool accumulate, int lane) {
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= t) continue;
    E* out = dst + std::int64_t(row) * stride;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = n * 8 + 2 * c + j;
        const float x = acc[n].r[2 * half + j] * factor[half];
        out[col] = from_float<E>(accumulate ? to_float(out[col]) + x : x);
      }
  }
}

/// Sum over the 4 lanes that hold a row of an accumulator (lanes 4g .. 4g + 3).
__device__ __forceinline__ float row_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float row_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// ---- forward ------------------------------------------------------------------------------------

/// Blocks of the forward kernel an SM keeps at once, as many as its shared memory holds at head
/// dimension 64: registers are held to 128 a thread for it (the compiler would take 130). 0: no
/// minimum.
template <int HD>
constexpr int forward_blocks_per_sm = HD == 64 ? 4 : 0;

/// Elements of one stage of the forward and dq kernels: a tile of keys and one of values.
template <int HD>
constexpr std::size_t key_value_stage = 2 * stream_rows<HD> * padded<HD>;

/// Starts key tile j and value tile j (stream_rows<HD> rows each) into one stage of the forward
/// and dq kernels: keys first, values after them.
template <class E, int HD>
__device__ __forceinline__ void start_key_value_tiles(E* stage, const E* k_head, const E* v_head, int j,
                                                      const Dims& dims) {
  constexpr int BK = stream_rows<HD>;
  start_tile<E, HD, BK>(stage, k_head, dims.kv_stride, j * BK, dims.t, dims.packs);
  start_tile<E, HD, BK>(stage + BK * padded<HD>, v_head, dims.kv_stride, j * BK, dims.t, dims.packs);
}

/// One block per 64 queries of one head; each warp keeps its 16 rows' scores, running maxima and
/// sums and outputs in registers across the key tiles up to the block's last query (the online
/// softmax: outputs rescaled as a row's maximum grows). Scores are kept in base 2 (times log2 e),
/// so that each probability is one exp2f.
template <class E, int HD>
__global__ void __launch_bounds__(block_threads, forward_blocks_per_sm<HD>)
    flash_forward_kernel(const E* q, const E* k, const E* v, E* out, float* lse, Dims dims) {
  constexpr int BK = stream_rows<HD>;
  constexpr std::size_t stage = key_value_stage<HD>;
  static_assert(2 * stage * sizeof(E) <= 48 * 1024, "within a block's default shared memory");
  static_assert(block_rows * padded<HD> <= 2 * stage, "the queries' tile fits in the stages");
  alignas(128) POLYSHARD_SHARED(E, smem, [2 * stage]);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  // The blocks of a head's last queries, which see the most keys, start first.
  const int t = dims.t, q0 = (gridDim.x - 1 - blockIdx.x) * block_rows, bh = blockIdx.y;
  const int b = bh / dims.n_head, h = bh % dims.n_head, kvh = h / dims.group;
  const std::int64_t base = std::int64_t(b) * t * dims.stride, kv_base = std::int64_t(b) * t * dims.kv_stride;
  const E* k_head = k + kv_base + std::int64_t(kvh) * HD;
  const E* v_head = v + kv_base + std::int64_t(kvh) * HD;
  MmaA qa[HD / 16];
  start_tile<E, HD, block_rows>(smem, q + base + std::int64_t(h) * HD, dims.stride, q0, t, dims.packs);
  copy_async_commit();
  copy_async_wait<0>();
  __syncthreads();
  load_strip<E, HD>(qa, smem + warp * warp_rows * padded<HD>, lane);
  __syncthreads();
  const int rows[2] = {q0 + warp * warp_rows + g, q0 + warp * warp_rows + g + 8};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's columns only
  MmaC o[HD / 8] = {};
  const int last_query = (q0 + block_rows < t ? q0 + block_rows : t) - 1;
  auto start = [&](int j, int s) { start_key_value_tiles<E, HD>(smem + s * stage, k_head, v_head, j, dims); };
  auto use = [&](int j, int st) {
    const E* ks = smem + st * stage;
    const E* vs = ks + BK * padded<HD>;
    const int k0 = j * BK;
    // Only the tiles that reach past the block's first query or past t need the mask.
    const bool edge = k0 + BK - 1 > q0 || k0 + BK > t;
    MmaC s[BK / 8];
    strip_scores<E, HD, BK>(s, qa, ks, lane);
    // The maxima are taken over the raw scores, and each probability is then one fused
    // multiply-add and one exponential: exp2(s scale log2 e - shift).
    float top[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < BK / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (edge) {
          const int key = k0 + n * 8 + 2 * c + i % 2;
          if (key > rows[i / 2] || key >= t) s[n].r[i] = -INFINITY;
        }
        top[i / 2] = fmaxf(top[i / 2], s[n].r[i]);
      }
    float alpha[2], shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      top[r] = fmaxf(m[r], row_max(top[r]) * dims.scale_log2);
      shift[r] = top[r] == -INFINITY ? 0.0f : top[r];  // a row with no key yet: every p is 0
      alpha[r] = exp2_ftz(m[r] - shift[r]);             // 0 while m is -inf (o and l are 0 then)
      m[r] = top[r];
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < BK / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[n].r[i] = exp2_ftz(fmaf(s[n].r[i], dims.scale_log2, -shift[i / 2]));
        l[i / 2] += s[n].r[i];
      }
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[n].r[i] *= alpha[i / 2];
    accumulate_product<E, HD, BK>(o, s, vs, lane);
  };
  stream_tiles(last_query / BK + 1, start, use);
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = row_sum(l[r]);  // positive for every query < t: key 0 is always seen
    inv[r] = 1.0f / total;
    if (c == 0 && rows[r] < t) lse[std::int64_t(bh) * t + rows[r]] = (m[r] + log2f(total)) * ln2;
  }
  write_strip<E, HD>(o, out + std::int64_t(b) * t * dims.out_stride + std::int64_t(h) * HD, dims.out_stride,
                     q0 + warp * warp_rows, t, inv, false, lane);
}

// ---- backward -----------------------------------------------------------------------------------

/// delta[(b H + h) T + t] = sum over the head's elements of dout * out: the term every
/// probability's gradient subtracts (FlashAttention-2's D); and lse2, the row's log-sum-exp in
/// base 2, which the dq and dk/dv kernels subtract from each of their scores. One warp per row.
template <class E, int HD>
__global__ void flash_delta_kernel(const E* out, const E* dout, const float* lse, float* delta, float* lse2, Dims dims,
                                   std::int64_t rows) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t row = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows;
       row += std::int64_t(gridDim.x) * blockDim.x / 32) {
    const std::int64_t bh = row / dims.t, b = bh / dims.n_head, h = bh % dims.n_head, query = row % dims.t;
    const std::int64_t at = (b * dims.t + query) * dims.out_stride + h * HD;
    float sum = 0.0f;
    for (int c = lane; c < HD; c += 32) sum += to_float(out[at + c]) * to_float(dout[at + c]);
    sum = warp_sum(sum);
    if (lane == 0) delta[row] = sum, lse2[row] = lse[row] * log2e;
  }
}

/// Blocks of the dq kernel an SM keeps at once at head dimension 64: three hold it to 168
/// registers a thread, where the compiler would take 178 and leave room for two (measured on an
/// H200: the backward 3% slower at two). 0: no minimum.
template <int HD>
constexpr int dq_blocks_per_sm = HD == 64 ? 3 : 0;

/// dq for 64 queries of one head: over the key tiles up to the block's last query, each warp
/// recomputes its rows' scores and the gradients of their probabilities in registers,
/// ds = p (dp - delta), and adds ds k to dq.
template <class E, int HD>
__global__ void __launch_bounds__(block_threads, dq_blocks_per_sm<HD>)
    flash_dq_kernel(const E* q, const E* k, const E* v, const E* dout, const float* lse2, const float* delta, E* dq,
                    bool accumulate, Dims dims) {
  constexpr int BK = stream_rows<HD>;
  constexpr std::size_t stage = key_value_stage<HD>;
  static_assert(2 * stage * sizeof(E) <= 48 * 1024, "within a block's default shared memory");
  static_assert(block_rows * padded<HD> <= stage, "a 64-row tile fits in a stage");
  alignas(128) POLYSHARD_SHARED(E, smem, [2 * stage]);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int t = dims.t, q0 = (gridDim.x - 1 - blockIdx.x) * block_rows, bh = blockIdx.y;
  const int b = bh / dims.n_head, h = bh % dims.n_head, kvh = h / dims.group;
  const std::int64_t base = std::int64_t(b) * t * dims.stride, kv_base = std::int64_t(b) * t * dims.kv_stride;
  const E* k_head = k + kv_base + std::int64_t(kvh) * HD;
  const E* v_head = v + kv_base + std::int64_t(kvh) * HD;
  MmaA qa[HD / 16], da[HD / 16];
  start_tile<E, HD, block_rows>(smem, q + base + std::int64_t(h) * HD, dims.stride, q0, t, dims.packs);
  start_tile<E, HD, block_rows>(smem + stage, dout + std::int64_t(b) * t * dims.out_stride + std::int64_t(h) * HD,
                                dims.out_stride, q0, t, dims.packs);
  copy_async_commit();
  copy_async_wait<0>();
  __syncthreads();
  load_strip<E, HD>(qa, smem + warp * warp_rows * padded<HD>, lane);
  load_strip<E, HD>(da, smem + stage + warp * warp_rows * padded<HD>, lane);
  __syncthreads();
  const int rows[2] = {q0 + warp * warp_rows + g, q0 + warp * warp_rows + g + 8};
  float row_lse[2], row_delta[2];  // the log-sum-exp in base 2
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_lse[r] = rows[r] < t ? lse2[std::int64_t(bh) * t + rows[r]] : 0.0f;
    row_delta[r] = rows[r] < t ? delta[std::int64_t(bh) * t + rows[r]] : 0.0f;
  }
  MmaC acc[HD / 8] = {};
  const int last_query = (q0 + block_rows < t ? q0 + block_rows : t) - 1;
  auto start = [&](int j, int s) { start_key_value_tiles<E, HD>(smem + s * stage, k_head, v_head, j, dims); };
  auto use = [&](int j, int st) {
    const E* ks = smem + st * stage;
    const E* vs = ks + BK * padded<HD>;
    const int k0 = j * BK;
    const bool edge = k0 + BK - 1 > q0 || k0 + BK > t || q0 + block_rows > t;
    MmaC s[BK / 8], dp[BK / 8];
    strip_scores<E, HD, BK>(s, qa, ks, lane);
    strip_scores<E, HD, BK>(dp, da, vs, lane);
#pragma unroll
    for (int n = 0; n < BK / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float p = exp2_ftz(fmaf(s[n].r[i], dims.scale_log2, -row_lse[i / 2]));
        if (edge) {
          const int key = k0 + n * 8 + 2 * c + i % 2, row = rows[i / 2];
          if (!(key <= row && key < t && row < t)) p = 0.0f;
        }
        s[n].r[i] = p * (dp[n].r[i] - row_delta[i / 2]);  // ds
      }
    accumulate_product<E, HD, BK>(acc, s, ks, lane);
  };
  stream_tiles(last_query / BK + 1, start, use);
  const float scale[2] = {dims.scale, dims.scale};
  write_strip<E, HD>(acc, dq + base + std::int64_t(h) * HD, dims.stride, q0 + warp * warp_rows, t, scale, accumulate,
                     lane);
}

/// Where the dk/dv kernel's stream of query tiles is: which of the group's query heads, which of
/// that head's tiles.
struct QueryTileCursor {
  int head = 0, tile = 0;
  __device__ __forceinline__ void step(int per_head) {
    if (++tile == per_head) tile = 0, ++head;
  }
};

/// Elements of one stage of the dk/dv kernel: a tile of queries, one of output gradients, and
/// their rows' log-sum-exp and delta (floats, two elements each).
template <int HD>
constexpr std::size_t query_stage = 2 * stream_rows<HD> * padded<HD> + 4 * stream_rows<HD>;

/// dk and dv for 64 keys of one key-value head: over its group's query heads and the query tiles
/// from the block's first key on, each warp recomputes its keys' transposed scores and their
/// gradients in registers and adds p^T dout to dv and ds^T q to dk.
template <class E, int HD>
__global__ void __launch_bounds__(block_threads)
    flash_dkdv_kernel(const E* q, const E* k, const E* v, const E* dout, const float* lse2, const float* delta, E* dk,
                      E* dv, bool accumulate, Dims dims) {
  constexpr int BQ = stream_rows<HD>;
  constexpr std::size_t stage = query_stage<HD>;
  static_assert(2 * stage * sizeof(E) <= 48 * 1024, "within a block's default shared memory");
  static_assert(block_rows * padded<HD> <= stage, "a 64-row tile fits in a stage");
  static_assert(stage * sizeof(E) % 16 == 0, "stages start 16-byte aligned");
  alignas(128) POLYSHARD_SHARED(E, smem, [2 * stage]);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int t = dims.t, k0 = blockIdx.x * block_rows;  // the first keys see the most queries, and start first
  const int n_kv_head = dims.n_head / dims.group;
  const int b = blockIdx.y / n_kv_head, kvh = blockIdx.y % n_kv_head;
  const std::int64_t base = std::int64_t(b) * t * dims.stride, head = std::int64_t(kvh) * HD;
  const std::int64_t kv_base = std::int64_t(b) * t * dims.kv_stride;
  MmaA ka[HD / 16], va[HD / 16];
  start_tile<E, HD, block_rows>(smem, k + kv_base + head, dims.kv_stride, k0, t, dims.packs);
  start_tile<E, HD, block_rows>(smem + stage, v + kv_base + head, dims.kv_stride, k0, t, dims.packs);
  copy_async_commit();
  copy_async_wait<0>();
  __syncthreads();
  load_strip<E, HD>(ka, smem + warp * warp_rows * padded<HD>, lane);
  load_strip<E, HD>(va, smem + stage + warp * warp_rows * padded<HD>, lane);
  __syncthreads();
  const int keys[2] = {k0 + warp * warp_rows + g, k0 + warp * warp_rows + g + 8};  // rows are keys here
  MmaC dk_acc[HD / 8] = {}, dv_acc[HD / 8] = {};
  // Tile j is query tile j % per_head of the group's query head j / per_head. start and use see
  // j in turn, so each steps a cursor instead of dividing by per_head (a run-time divisor: tens
  // of integer instructions a tile).
  const int first_query = k0 / BQ * BQ, per_head = (t - first_query + BQ - 1) / BQ;
  QueryTileCursor starting, using_;
  auto start = [&](int, int s) {
    E* qs = smem + s * stage;
    E* dos = qs + BQ * padded<HD>;
    float* tile_lse2 = reinterpret_cast<float*>(dos + BQ * padded<HD>);
    const int h = kvh * dims.group + starting.head, bh = b * dims.n_head + h, q0 = first_query + starting.tile * BQ;
    starting.step(per_head);
    start_tile<E, HD, BQ>(qs, q + base + std::int64_t(h) * HD, dims.stride, q0, t, dims.packs);
    start_tile<E, HD, BQ>(dos, dout + std::int64_t(b) * t * dims.out_stride + std::int64_t(h) * HD, dims.out_stride,
                          q0, t, dims.packs);
    start_rows<BQ>(tile_lse2, lse2 + std::int64_t(bh) * t, q0, t);
    start_rows<BQ>(tile_lse2 + BQ, delta + std::int64_t(bh) * t, q0, t);
  };
  auto use = [&](int, int st) {
    const E* qs = smem + st * stage;
    const E* dos = qs + BQ * padded<HD>;
    const float* tile_lse2 = reinterpret_cast<const float*>(dos + BQ * padded<HD>);
    const float* tile_delta = tile_lse2 + BQ;
    const int q0 = first_query + using_.tile * BQ;
    using_.step(per_head);
    const bool edge = q0 < k0 + block_rows - 1 || q0 + BQ > t || k0 + block_rows > t;
    MmaC s[BQ / 8], dp[BQ / 8];
    strip_scores<E, HD, BQ>(s, ka, qs, lane);
    strip_scores<E, HD, BQ>(dp, va, dos, lane);
#pragma unroll
    for (int n = 0; n < BQ / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = n * 8 + 2 * c + i % 2;
        float p = exp2_ftz(fmaf(s[n].r[i], dims.scale_log2, -tile_lse2[col]));
        if (edge) {
          const int query = q0 + col, key = keys[i / 2];
          if (!(key <= query && query < t && key < t)) p = 0.0f;
        }
        s[n].r[i] = p;
        dp[n].r[i] = p * (dp[n].r[i] - tile_delta[col]);  // ds^T
      }
    accumulate_product<E, HD, BQ>(dv_acc, s, dos, lane);
    accumulate_product<E, HD, BQ>(dk_acc, dp, qs, lane);
  };
  if (k0 < t) stream_tiles(dims.group * per_head, start, use);
  const float one[2] = {1.0f, 1.0f}, scale[2] = {dims.scale, dims.scale};
  const int row0 = k0 + warp * warp_rows;
  if (dv) write_strip<E, HD>(dv_acc, dv + kv_base + head, dims.kv_stride, row0, t, one, accumulate, lane);
  if (dk) write_strip<E, HD>(dk_acc, dk + kv_base + head, dims.kv_stride, row0, t, scale, accumulate, lane);
}

// ---- launchers ----------------------------------------------------------------------------------

void check_shape(const char* op, const AttentionShape& a) {
  POLYSHARD_CHECK(a.batch >= 0 && a.seq >= 0, op, ": batch ", a.batch, " and sequence length ", a.seq,
                  " must not be negative");
  POLYSHARD_CHECK(a.seq <= (std::int64_t(1) << 30), op, ": sequence length ", a.seq, " is above 2^30");
  POLYSHARD_CHECK(flash_attention_supports(a.head_dim), op, ": head dimension ", a.head_dim,
                  " is not one of 16, 32, 64 and 128");
  POLYSHARD_CHECK(a.n_head > 0 && a.n_kv_head > 0 && a.n_head % a.n_kv_head == 0, op, ": ", a.n_head,
                  " query heads do not share ", a.n_kv_head, " key-value heads in equal groups");
  POLYSHARD_CHECK(a.stride >= a.n_head * a.head_dim, op, ": stride ", a.stride, " is shorter than a position's ",
                  a.n_head, " query heads of ", a.head_dim);
  POLYSHARD_CHECK(a.kv_stride == 0 || a.kv_stride >= a.n_kv_head * a.head_dim, op, ": key-value stride ", a.kv_stride,
                  " is shorter than a position's ", a.n_kv_head, " key-value heads of ", a.head_dim);
  POLYSHARD_CHECK(a.out_stride >= a.n_head * a.head_dim, op, ": output stride ", a.out_stride,
                  " is shorter than a position's ", a.n_head, " heads of ", a.head_dim);
  POLYSHARD_CHECK(a.batch * a.n_head <= 65535, op, ": batch * n_head = ", a.batch * a.n_head,
                  " is above the 65,535 blocks of a grid's second dimension");
}

Dims dims_of(const AttentionShape& a, bool packs) {
  Dims d;
  d.t = static_cast<int>(a.seq);
  d.n_head = static_cast<int>(a.n_head);
  d.group = static_cast<int>(a.n_head / a.n_kv_head);
  d.stride = a.stride;
  d.kv_stride = a.kv_stride != 0 ? a.kv_stride : a.stride;
  d.out_stride = a.out_stride;
  d.scale = static_cast<float>(1.0 / std::sqrt(double(a.head_dim)));
  d.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(double(a.head_dim)));
  d.packs = packs;
  return d;
}

/// Whether every row of these tensors starts 16-byte aligned, so tiles load as 16-byte packs.
template <class E>
bool rows_aligned(std::initializer_list<const void*> pointers, std::initializer_list<std::int64_t> strides) {
  for (const void* p : pointers)
    if (p != nullptr && !aligned16(p)) return false;
  for (std::int64_t s : strides)
    if ((s * std::int64_t(sizeof(E))) % 16 != 0) return false;
  return true;
}

unsigned blocks_for(std::int64_t rows, int own) { return static_cast<unsigned>((rows + own - 1) / own); }

/// Calls f.template operator()<HD>() for the shape's head dimension.
template <class F>
void with_head_dim(std::int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 16: f.template operator()<16>(); break;
    case 32: f.template operator()<32>(); break;
    case 64: f.template operator()<64>(); break;
    case 128: f.template operator()<128>(); break;
    default: POLYSHARD_CHECK(false, "flash attention: head dimension ", head_dim, " is not one of 16, 32, 64 and 128");
  }
}

}  // namespace

bool flash_attention_supports(std::int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

template <class T>
void flash_attention_forward(const T* q, const T* k, const T* v, T* out, float* lse, const AttentionShape& shape,
                             cudaStream_t stream) {
  using E = device_t<T>;
  const char* op = "flash attention";
  check_shape(op, shape);
  if (shape.batch == 0 || shape.seq == 0) return;
  const bool packs = rows_aligned<E>({q, k, v, out}, {shape.stride, shape.kv_stride, shape.out_stride});
  const Dims dims = dims_of(shape, packs);
  with_head_dim(shape.head_dim, [&]<int HD>() {
    const dim3 grid(blocks_for(shape.seq, block_rows), static_cast<unsigned>(shape.batch * shape.n_head));
    launch<flash_forward_kernel<E, HD>>(grid, block_threads, 0, stream, device_ptr(q), device_ptr(k),
                                        device_ptr(v), device_ptr(out), lse, dims);
  });
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

std::int64_t flash_attention_backward_workspace_floats(const AttentionShape& shape) {
  return 2 * shape.batch * shape.n_head * shape.seq;  // delta and lse2
}

template <class T>
void flash_attention_backward(const T* q, const T* k, const T* v, const T* out, const T* dout, const float* lse,
                              DeviceGradOut<T> dq, DeviceGradOut<T> dk, DeviceGradOut<T> dv, float* workspace,
                              const AttentionShape& shape, cudaStream_t stream) {
  using E = device_t<T>;
  const char* op = "flash attention backward";
  check_shape(op, shape);
  if (shape.batch == 0 || shape.seq == 0 || !(dq.wanted() || dk.wanted() || dv.wanted())) return;
  POLYSHARD_CHECK(dk.accumulate == dv.accumulate, op, ": dk and dv are either both written or both added to");
  const bool packs = rows_aligned<E>({q, k, v, out, dout, dq.data, dk.data, dv.data},
                                     {shape.stride, shape.kv_stride, shape.out_stride});
  const Dims dims = dims_of(shape, packs);
  const std::int64_t rows = shape.batch * shape.n_head * shape.seq;
  float* delta = workspace;
  float* lse2 = workspace + rows;
  with_head_dim(shape.head_dim, [&]<int HD>() {
    const unsigned delta_blocks = static_cast<unsigned>(std::min<std::int64_t>((rows + 7) / 8, 65535));
    launch<flash_delta_kernel<E, HD>>(delta_blocks, 256, 0, stream, device_ptr(out), device_ptr(dout), lse, delta, lse2,
                                      dims, rows);
    POLYSHARD_CUDA_CHECK_LAUNCH("flash attention backward (delta)");
    if (dq.wanted()) {
      launch<flash_dq_kernel<E, HD>>(
          dim3(blocks_for(shape.seq, block_rows), static_cast<unsigned>(shape.batch * shape.n_head)), block_threads, 0,
          stream, device_ptr(q), device_ptr(k), device_ptr(v), device_ptr(dout), static_cast<const float*>(lse2),
          static_cast<const float*>(delta), device_ptr(dq.data), dq.accumulate, dims);
      POLYSHARD_CUDA_CHECK_LAUNCH("flash attention backward (dq)");
    }
    if (dk.wanted() || dv.wanted()) {
      launch<flash_dkdv_kernel<E, HD>>(
          dim3(blocks_for(shape.seq, block_rows), static_cast<unsigned>(shape.batch * shape.n_kv_head)), block_threads,
          0, stream, device_ptr(q), device_ptr(k), device_ptr(v), device_ptr(dout), static_cast<const float*>(lse2),
          static_cast<const float*>(delta), device_ptr(dk.data), device_ptr(dv.data), dk.accumulate, dims);
      POLYSHARD_CUDA_CHECK_LAUNCH("flash attention backward (dk, dv)");
    }
  });
}

#define POLYSHARD_FLASH_ATTENTION(T)                                                                             \
  template void flash_attention_forward<T>(const T*, const T*, const T*, T*, float*, const AttentionShape&,      \
                                           cudaStream_t);                                                        \
  template void flash_attention_backward<T>(const T*, const T*, const T*, const T*, const T*, const float*,      \
                                            DeviceGradOut<T>, DeviceGradOut<T>, DeviceGradOut<T>, float*,        \
                                            const AttentionShape&, cudaStream_t);
POLYSHARD_FLASH_ATTENTION(half)
POLYSHARD_FLASH_ATTENTION(bfloat16)
#undef POLYSHARD_FLASH_ATTENTION

}  // namespace polyshard::cuda
