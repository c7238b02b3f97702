// The GPT's CUDA kernels (forward and backward) and their launchers; each kernel is the twin of
// the CPU op of the same name in polyshard/tensor/ops/ and computes in float for every element
// type. Instantiated at the end for float, half and bfloat16.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "polyshard/core/cuda/async_copy.cuh"
#include "polyshard/core/cuda/device_math.cuh"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/tensor/cuda/sort.hpp"
#include "polyshard/tensor/cuda/transformer_kernels.hpp"

namespace polyshard::cuda {
namespace {

// ---- shared pieces --------------------------------------------------------------------------

constexpr int block_threads = 256;  // a multiple of 32, as block_sum and block_max need
constexpr int warps_per_block = block_threads / 32;
constexpr int wide_row_threads = 1024;  // for rows of at least wide_row columns
constexpr std::int64_t wide_row = 8192;
constexpr std::int64_t max_width = std::int64_t(1) << 30;  // columns: int indices with headroom for i += lanes * 8

/// Threads of a block-per-row kernel for rows of `n` columns.
int row_threads(std::int64_t n) { return n >= wide_row ? wide_row_threads : block_threads; }

constexpr float gelu_k0 = 0.7978845608028654f;  // sqrt(2 / pi), as tensor/ops/gelu.hpp
constexpr float gelu_k1 = 0.044715f;

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

/// Elements before the first 16-byte boundary at or after p.
template <class D>
__device__ __forceinline__ int pack_head(const void* p) {
  const unsigned misalignment = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(p) & 15u);
  return static_cast<int>(((16u - misalignment) & 15u) / sizeof(D));
}

/// Whether two pointers sit at the same place modulo 16 bytes, so one scalar head aligns both.
__device__ __forceinline__ bool co_aligned(const void* a, const void* b) {
  return ((reinterpret_cast<std::uintptr_t>(a) ^ reinterpret_cast<std::uintptr_t>(b)) & 15u) == 0;
}

/// Visits each index of a row of n elements exactly once, spread over threads `lane` of `lanes`:
/// vec(i) for the whole 16-byte packs [i, i + P) from `head` on, scalar(i) for the elements
/// before `head` and after the last whole pack. head < 0 (pointers not co-aligned) or
/// head >= n: every element is scalar.
template <class D, class Scalar, class Vec>
__device__ __forceinline__ void row_loop(int n, int head, int lane, int lanes, Scalar&& scalar, Vec&& vec) {
  constexpr int P = Pack<D>::size;
  int vec_begin = n, vec_end = n;  // packs cover [vec_begin, vec_end)
  if (head >= 0 && head < n) {
    vec_begin = head;
    vec_end = head + (n - head) / P * P;
  }
  for (int i = lane; i < vec_begin; i += lanes) scalar(i);
  for (int i = vec_begin + lane * P; i < vec_end; i += lanes * P) vec(i);
  for (int i = vec_end + lane; i < n; i += lanes) scalar(i);
}

/// Copies (or adds, Acc) W elements from src to dst: one 16-byte pack when W is the pack size.
template <class D, int W, bool Acc>
__device__ __forceinline__ void move_unit(const D* src, D* dst) {
  if constexpr (W == 1) {
    if constexpr (Acc) dst[0] = from_float<D>(to_float(dst[0]) + to_float(src[0]));
    else dst[0] = src[0];
  } else {
    static_assert(W == Pack<D>::size, "move_unit: W is 1 or a whole pack");
    Pack<D> s = load_pack(src);
    if constexpr (Acc) {
      const Pack<D> o = load_pack(dst);
#pragma unroll
      for (int e = 0; e < W; ++e) s.v[e] = from_float<D>(to_float(o.v[e]) + to_float(s.v[e]));
    }
    store_pack(dst, s);
  }
}

__device__ __forceinline__ std::int64_t global_thread() {
  return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_threads() { return std::int64_t(gridDim.x) * blockDim.x; }

/// out[i] = f(a[i], b[i], c[i]) for i < n over the grid, reading NIn of the inputs (the others
/// may be null): whole packs when `packs` (every pointer 16-byte aligned), then a scalar tail;
/// all scalar otherwise. Each index is read and written by one thread, so out may alias an input.
template <int NIn, class D, class F>
__device__ __forceinline__ void map_elements(const D* a, const D* b, const D* c, D* out, std::int64_t n, bool packs,
                                             F f) {
  constexpr int P = Pack<D>::size;
  const std::int64_t first = global_thread(), stride = grid_threads();
  std::int64_t scalar_begin = 0;
  if (packs) {
    const std::int64_t n_packs = n / P;
    for (std::int64_t k = first; k < n_packs; k += stride) {
      const std::int64_t i = k * P;
      const Pack<D> pa = load_pack(a + i);
      Pack<D> pb = pa, pc = pa;
      if constexpr (NIn > 1) pb = load_pack(b + i);
      if constexpr (NIn > 2) pc = load_pack(c + i);
      Pack<D> po;
#pragma unroll
      for (int e = 0; e < P; ++e) po.v[e] = from_float<D>(f(to_float(pa.v[e]), to_float(pb.v[e]), to_float(pc.v[e])));
      store_pack(out + i, po);
    }
    scalar_begin = n_packs * P;
  }
  for (std::int64_t i = scalar_begin + first; i < n; i += stride) {
    const float x = to_float(a[i]);
    float y = x, z = x;
    if constexpr (NIn > 1) y = to_float(b[i]);
    if constexpr (NIn > 2) z = to_float(c[i]);
    out[i] = from_float<D>(f(x, y, z));
  }
}

template <class... Ps>
bool all_aligned16(const Ps*... ps) {
  return (aligned16(ps) && ...);
}

void check_count(const char* op, const char* what, std::int64_t value) {
  POLYSHARD_CHECK(value >= 0, op, ": ", what, " must not be negative, got ", value);
}
void check_width(const char* op, const char* what, std::int64_t value) {
  POLYSHARD_CHECK(value > 0 && value <= max_width, op, ": ", what, " must be in [1, 2^30], got ", value);
}
void check_pointer(const char* op, const char* what, const void* p) {
  POLYSHARD_CHECK(p != nullptr, op, ": ", what, " is a null pointer");
}

// ---- elementwise ----------------------------------------------------------------------------

struct GeluForward {
  __device__ float operator()(float x, float, float) const {
    return 0.5f * x * (1.f + tanhf(gelu_k0 * (x + gelu_k1 * (x * x * x))));
  }
};

/// dy * gelu'(x), plus the old dx when accumulating (third input).
template <bool Acc>
struct GeluBackward {
  __device__ float operator()(float x, float dy, float old) const {
    const float t = tanhf(gelu_k0 * (x + gelu_k1 * (x * x * x)));
    // d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) k0 (1 + 3 k1 x^2)
    const float grad = dy * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * gelu_k0 * (1.f + 3.f * gelu_k1 * (x * x)));
    return Acc ? old + grad : grad;
  }
};

/// x sigmoid(x); expf(-x) overflows to infinity below about -88, giving -0, the limit.
struct SiluForward {
  __device__ float operator()(float x, float, float) const { return x / (1.f + expf(-x)); }
};

/// dy * silu'(x) = dy s (1 + x (1 - s)) with s = sigmoid(x), plus the old dx when accumulating.
template <bool Acc>
struct SiluBackward {
  __device__ float operator()(float x, float dy, float old) const {
    const float s = 1.f / (1.f + expf(-x));
    const float grad = dy * (s * (1.f + x * (1.f - s)));
    return Acc ? old + grad : grad;
  }
};

struct Add {
  __device__ float operator()(float a, float b, float) const { return a + b; }
};

/// y + x with the inputs given as (x, y).
struct AddInto {
  __device__ float operator()(float x, float y, float) const { return y + x; }
};

struct Scale {
  float s;
  __device__ float operator()(float x, float, float) const { return x * s; }
};

/// y = F()(x), elementwise: an activation's forward (GeluForward, SiluForward).
template <class D, class F>
__global__ void activation_forward_kernel(const D* x, D* y, std::int64_t n, bool packs) {
  map_elements<1>(x, static_cast<const D*>(nullptr), static_cast<const D*>(nullptr), y, n, packs, F{});
}

/// dx (+)= B<Acc>()(x, dy, dx): an activation's backward (GeluBackward, SiluBackward).
template <class D, template <bool> class B, bool Acc>
__global__ void activation_backward_kernel(const D* x, const D* dy, D* dx, std::int64_t n, bool packs) {
  map_elements<Acc ? 3 : 2>(x, dy, static_cast<const D*>(dx), dx, n, packs, B<Acc>{});
}

template <class D>
__global__ void add_forward_kernel(const D* a, const D* b, D* out, std::int64_t n, bool packs) {
  map_elements<2>(a, b, static_cast<const D*>(nullptr), out, n, packs, Add{});
}

template <class D>
__global__ void add_accumulate_forward_kernel(const D* x, D* y, std::int64_t n, bool packs) {
  map_elements<2>(x, static_cast<const D*>(y), static_cast<const D*>(nullptr), y, n, packs, AddInto{});
}

template <class D>
__global__ void scale_forward_kernel(const D* x, float s, D* out, std::int64_t n, bool packs) {
  map_elements<1>(x, static_cast<const D*>(nullptr), static_cast<const D*>(nullptr), out, n, packs, Scale{s});
}

struct Mul {
  __device__ float operator()(float a, float b, float) const { return a * b; }
};

/// y + s x with the inputs given as (x, y).
struct AddScaled {
  float s;
  __device__ float operator()(float x, float y, float) const { return y + s * x; }
};

/// y (+)= factor * dloss[0] * x: every thread reads the scalar (one cached load), so no host
/// needs to.
template <class D, bool Acc>
__global__ void scale_by_device_scalar_kernel(const D* x, const D* dloss, float factor, D* y, std::int64_t n,
                                              bool packs) {
  const float s = factor * to_float(*dloss);
  if constexpr (Acc)
    map_elements<2>(x, static_cast<const D*>(y), static_cast<const D*>(nullptr), y, n, packs, AddScaled{s});
  else
    map_elements<1>(x, static_cast<const D*>(nullptr), static_cast<const D*>(nullptr), y, n, packs, Scale{s});
}

template <class D>
__global__ void mul_forward_kernel(const D* a, const D* b, D* out, std::int64_t n, bool packs) {
  map_elements<2>(a, b, static_cast<const D*>(nullptr), out, n, packs, Mul{});
}

template <class D>
__global__ void add_scaled_forward_kernel(const D* x, float s, D* y, std::int64_t n, bool packs) {
  map_elements<2>(x, static_cast<const D*>(y), static_cast<const D*>(nullptr), y, n, packs, AddScaled{s});
}

/// One element per thread (grid-stride); its column is its index modulo the row length.
template <class D>
__global__ void add_bias_rows_kernel(D* y, const D* bias, std::int64_t n, std::int64_t cols) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    y[i] = from_float<D>(to_float(y[i]) + to_float(bias[i % cols]));
}

/// Stage one of sum(): block b adds elements b*blockDim + t, stepping by the whole grid, in
/// double, and writes one partial. The grid is always sum_blocks blocks, so the order is fixed.
template <class D>
__global__ void sum_partials_kernel(const D* x, std::int64_t n, double* partials) {
  POLYSHARD_SHARED(double, shared, [32]);
  double acc = 0;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) acc += static_cast<double>(to_float(x[i]));
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

/// Stage two: one block adds the partials (one per thread: sum_blocks == block_threads).
__global__ void sum_finish_kernel(const double* partials, double* out) {
  POLYSHARD_SHARED(double, shared, [32]);
  const double total = block_sum(partials[threadIdx.x], shared);
  if (threadIdx.x == 0) *out = total;
}
static_assert(sum_blocks == block_threads, "sum_finish_kernel reads one partial per thread");

/// Blocks for an elementwise kernel over n elements, P per thread on the pack path.
template <class D>
unsigned elementwise_grid(std::int64_t n, bool packs) {
  const std::int64_t items = packs ? n / Pack<D>::size + Pack<D>::size : n;  // packs plus the tail
  return grid_for(static_cast<std::size_t>(items), block_threads);
}

// ---- column sums (bias, layer-norm weight and bias gradients) ---------------------------------
// Deterministic in two kernels: blocks of (32 columns x 8 row lanes) sum a chunk of rows into
// workspace[k][chunk][col] (k: which sum), then blocks of 32 columns add the chunks in a fixed order.

constexpr int col_strip = 32;
constexpr int col_lanes = 8;
constexpr std::int64_t max_chunks = 256;
constexpr std::int64_t min_rows_per_chunk = 32;

std::int64_t rows_per_chunk(std::int64_t rows) {
  return std::max(min_rows_per_chunk, (rows + max_chunks - 1) / max_chunks);
}
std::int64_t chunk_count(std::int64_t rows) {
  const std::int64_t per = rows_per_chunk(rows);
  return (rows + per - 1) / per;  // 0 for no rows, at most max_chunks
}

/// column_sum's one term per element: x itself.
template <class D>
struct ColumnTerms {
  static constexpr int k = 1;
  const D* x;  // (rows, cols)
  __device__ void operator()(std::int64_t r, int c, std::int64_t cols, float* out) const {
    out[0] = to_float(x[r * cols + c]);
  }
};

/// layer_norm_backward's two terms per element: dy xhat (for dweight) and dy (for dbias).
template <class D>
struct LayerNormParamTerms {
  static constexpr int k = 2;
  const D* x;          // (rows, cols)
  const D* dy;         // (rows, cols)
  const float* mean;   // (rows,)
  const float* rstd;   // (rows,)
  __device__ void operator()(std::int64_t r, int c, std::int64_t cols, float* out) const {
    const float d = to_float(dy[r * cols + c]);
    out[0] = d * ((to_float(x[r * cols + c]) - mean[r]) * rstd[r]);
    out[1] = d;
  }
};

/// rms_norm_backward's one term per element: dy xhat (for dweight), xhat = x rstd.
template <class D>
struct RmsNormWeightTerms {
  static constexpr int k = 1;
  const D* x;          // (rows, cols)
  const D* dy;         // (rows, cols)
  const float* rstd;   // (rows,)
  __device__ void operator()(std::int64_t r, int c, std::int64_t cols, float* out) const {
    out[0] = to_float(dy[r * cols + c]) * (to_float(x[r * cols + c]) * rstd[r]);
  }
};

/// Grid (ceil(cols / 32), chunks), block (32, 8). partial: (K, chunks, cols) float.
template <class Terms>
__global__ void column_sum_forward_kernel(Terms terms, std::int64_t rows, int cols, std::int64_t per_chunk,
                                          float* partial, int chunks) {
  constexpr int K = Terms::k;
  POLYSHARD_SHARED(float, lanes, [K][col_lanes][col_strip]);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int col = static_cast<int>(blockIdx.x) * col_strip + tx;
  const int chunk = static_cast<int>(blockIdx.y);
  const std::int64_t r0 = chunk * per_chunk;
  const std::int64_t r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.f;
  if (col < cols) {
    for (std::int64_t r = r0 + ty; r < r1; r += col_lanes) {
      float t[K];
      terms(r, col, cols, t);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += t[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) lanes[k][ty][tx] = acc[k];
  __syncthreads();  // every thread reaches this: no early return above
  if (ty == 0 && col < cols) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s = 0.f;
      for (int y = 0; y < col_lanes; ++y) s += lanes[k][y][tx];
      partial[(std::int64_t(k) * chunks + chunk) * cols + col] = s;
    }
  }
}

/// Warps of column_sum_finish_kernel's blocks: each block finishes 32 columns, its warps taking
/// the chunks in turn.
constexpr int finish_warps = 32;

/// out_k[c] (+)= the sum over chunks of partial[k][chunk][c]; a null out_k is skipped. A block
/// takes 32 columns (a warp's loads are coalesced), warp w the chunks w, w + 32, ... in order,
/// then one warp adds the 32 warps' sums in order: a fixed order, so the same bits every run,
/// with a block's loads in flight at once. (One thread a column, adding the chunks one after
/// another, waited a memory round trip per chunk: about 40 us for 768 columns on an H200.)
template <class D>
__global__ void __launch_bounds__(finish_warps * 32)
    column_sum_finish_kernel(const float* partial, int chunks, int cols, D* out0, bool acc0, D* out1, bool acc1) {
  POLYSHARD_SHARED(float, sums, [2][finish_warps][32]);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  for (std::int64_t base = std::int64_t(blockIdx.x) * 32; base < cols; base += std::int64_t(gridDim.x) * 32) {
    const std::int64_t c = base + lane;
    __syncthreads();  // the previous columns' sums are read
    for (int k = 0; k < 2; ++k) {
      float s = 0.f;
      if (c < cols && (k == 0 ? out0 : out1) != nullptr) {
#pragma unroll 4
        for (int j = warp; j < chunks; j += finish_warps) s += partial[(std::int64_t(k) * chunks + j) * cols + c];
      }
      sums[k][warp][lane] = s;
    }
    __syncthreads();
    if (warp != 0 || c >= cols) continue;
    for (int k = 0; k < 2; ++k) {
      D* out = k == 0 ? out0 : out1;
      if (out == nullptr) continue;
      float s = 0.f;
      for (int w = 0; w < finish_warps; ++w) s += sums[k][w][lane];
      const bool acc = k == 0 ? acc0 : acc1;
      out[c] = from_float<D>(acc ? to_float(out[c]) + s : s);
    }
  }
}

/// Both kernels of a column reduction; out1 is used only when Terms::k == 2.
template <class D, class Terms>
void launch_column_sums(const char* op, Terms terms, std::int64_t rows, std::int64_t cols, float* workspace,
                        std::size_t workspace_floats, D* out0, bool acc0, D* out1, bool acc1, cudaStream_t stream) {
  const std::int64_t chunks = chunk_count(rows);
  const std::size_t needed = static_cast<std::size_t>(Terms::k * chunks * cols);
  POLYSHARD_CHECK(needed == 0 || workspace != nullptr, op, ": needs a workspace of ", needed,
                  " floats, got a null pointer");
  POLYSHARD_CHECK(workspace_floats >= needed, op, ": needs a workspace of ", needed, " floats for ", rows,
                  " rows of ", cols, ", got ", workspace_floats);
  if (chunks > 0) {
    const dim3 grid(static_cast<unsigned>((cols + col_strip - 1) / col_strip), static_cast<unsigned>(chunks));
    launch<column_sum_forward_kernel<Terms>>(grid, dim3(col_strip, col_lanes), 0, stream, terms, rows,
                                             static_cast<int>(cols), rows_per_chunk(rows), workspace,
                                             static_cast<int>(chunks));
    POLYSHARD_CUDA_CHECK_LAUNCH(op);
  }
  launch<column_sum_finish_kernel<D>>(grid_for(static_cast<std::size_t>(cols), 32), finish_warps * 32, 0, stream,
                                      workspace, static_cast<int>(chunks), static_cast<int>(cols), out0, acc0, out1,
                                      acc1);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

// ---- embedding ------------------------------------------------------------------------------

/// One W-element unit per thread: out row i, units j. Grid-stride over n * (c / W) units.
template <class D, int W>
__global__ void embedding_forward_kernel(const int* ids, const D* table, D* out, std::int64_t n, std::int64_t v,
                                         std::int64_t c) {
  const std::int64_t units_per_row = c / W, units = n * units_per_row;
  for (std::int64_t u = global_thread(); u < units; u += grid_threads()) {
    const std::int64_t i = u / units_per_row, j = u % units_per_row;
    const int id = ids[i];
    D* dst = out + i * c + j * W;
    if (id >= 0 && id < v) {
      move_unit<D, W, false>(table + std::int64_t(id) * c + j * W, dst);
    } else {
#pragma unroll
      for (int e = 0; e < W; ++e) dst[e] = from_float<D>(quiet_nan());
    }
  }
}

/// Sort keys: the id, or v (sorted last, then skipped) when out of range; values: positions.
__global__ void embedding_backward_keys_kernel(const int* ids, unsigned* keys, int* positions, int n, int v) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int id = ids[i];
    keys[i] = (id >= 0 && id < v) ? static_cast<unsigned>(id) : static_cast<unsigned>(v);
    positions[i] = static_cast<int>(i);
  }
}

/// One block per sorted position j that starts a run of equal keys: sums dout over the run's
/// positions (increasing, as the sort is stable) in float and adds the sum to the table row
/// once. Rows are owned by one block each: no atomics, the same result every run.
template <class D>
__global__ void embedding_backward_kernel(const unsigned* keys, const int* positions, const D* dout, D* dtable, int n,
                                          unsigned v, std::int64_t c) {
  for (int j = static_cast<int>(blockIdx.x); j < n; j += static_cast<int>(gridDim.x)) {
    const unsigned key = keys[j];
    if (key == v || (j > 0 && keys[j - 1] == key)) continue;  // block-uniform
    int end = j + 1;
    while (end < n && keys[end] == key) ++end;
    D* row = dtable + std::int64_t(key) * c;  // (C,)
    for (std::int64_t col = threadIdx.x; col < c; col += blockDim.x) {
      float s = 0.f;
      for (int k = j; k < end; ++k) s += to_float(dout[std::int64_t(positions[k]) * c + col]);
      row[col] = from_float<D>(to_float(row[col]) + s);
    }
  }
}

/// The workspace of embedding_backward carved into its arrays, each 256-byte aligned.
struct EmbeddingWorkspace {
  unsigned* keys_in = nullptr;   // (N,)
  unsigned* keys_out = nullptr;  // (N,)
  int* positions_in = nullptr;   // (N,)
  int* positions_out = nullptr;  // (N,)
  void* sort_temp = nullptr;
  std::size_t sort_temp_bytes = 0;
  std::size_t total_bytes = 0;  // including up to 255 bytes to align the base
};

constexpr std::size_t round_up_256(std::size_t b) { return (b + 255) / 256 * 256; }

/// Bits the sort looks at: enough for the keys 0..v (v is the out-of-range key).
int embedding_sort_bits(std::int64_t v) { return static_cast<int>(std::bit_width(static_cast<std::uint64_t>(v))); }

EmbeddingWorkspace embedding_workspace(std::int64_t n, std::int64_t v, void* base) {
  EmbeddingWorkspace w;
  POLYSHARD_CUDA_CHECK(sort_pairs(nullptr, w.sort_temp_bytes, nullptr, nullptr, nullptr, nullptr, static_cast<int>(n),
                                  0, embedding_sort_bits(v)));
  const std::size_t ints = round_up_256(static_cast<std::size_t>(n) * sizeof(int));
  w.total_bytes = 255 + 4 * ints + round_up_256(w.sort_temp_bytes);
  if (base != nullptr) {
    auto p = (reinterpret_cast<std::uintptr_t>(base) + 255) / 256 * 256;
    w.keys_in = reinterpret_cast<unsigned*>(p);
    w.keys_out = reinterpret_cast<unsigned*>(p + ints);
    w.positions_in = reinterpret_cast<int*>(p + 2 * ints);
    w.positions_out = reinterpret_cast<int*>(p + 3 * ints);
    w.sort_temp = reinterpret_cast<void*>(p + 4 * ints);
  }
  return w;
}

void check_embedding_sizes(const char* op, std::int64_t n, std::int64_t v, std::int64_t c) {
  POLYSHARD_CHECK(n >= 0 && n < max_width, op, ": the number of ids must be in [0, 2^30), got ", n);
  POLYSHARD_CHECK(v > 0 && v < max_width, op, ": the table's rows V must be in [1, 2^30), got ", v);
  check_width(op, "the table's width C", c);
}

// ---- layer norm -----------------------------------------------------------------------------

/// One warp per row (grid-stride over rows, warp-uniform): mean, then squared deviations, then y.
template <class D>
__global__ void layer_norm_forward_kernel(const D* x, const D* weight, const D* bias, float eps, D* y, float* mean,
                                          float* rstd, std::int64_t rows, int c) {
  constexpr int P = Pack<D>::size;
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t r = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const D* xr = x + r * c;  // (C,)
    D* yr = y + r * c;        // (C,)
    const int head = co_aligned(xr, yr) && co_aligned(xr, weight) && co_aligned(xr, bias) ? pack_head<D>(xr) : -1;
    float s = 0.f;
    row_loop<D>(
        c, head, lane, 32, [&](int i) { s += to_float(xr[i]); },
        [&](int i) {
          const Pack<D> p = load_pack(xr + i);
#pragma unroll
          for (int e = 0; e < P; ++e) s += to_float(p.v[e]);
        });
    const float mu = warp_sum(s) / static_cast<float>(c);
    float ss = 0.f;
    row_loop<D>(
        c, head, lane, 32,
        [&](int i) {
          const float d = to_float(xr[i]) - mu;
          ss += d * d;
        },
        [&](int i) {
          const Pack<D> p = load_pack(xr + i);
#pragma unroll
          for (int e = 0; e < P; ++e) {
            const float d = to_float(p.v[e]) - mu;
            ss += d * d;
          }
        });
    const float rs = 1.f / sqrtf(warp_sum(ss) / static_cast<float>(c) + eps);
    row_loop<D>(
        c, head, lane, 32,
        [&](int i) { yr[i] = from_float<D>((to_float(xr[i]) - mu) * rs * to_float(weight[i]) + to_float(bias[i])); },
        [&](int i) {
          const Pack<D> px = load_pack(xr + i), pw = load_pack(weight + i), pb = load_pack(bias + i);
          Pack<D> py;
#pragma unroll
          for (int e = 0; e < P; ++e)
            py.v[e] = from_float<D>((to_float(px.v[e]) - mu) * rs * to_float(pw.v[e]) + to_float(pb.v[e]));
          store_pack(yr + i, py);
        });
    if (lane == 0) {
      if (mean != nullptr) mean[r] = mu;
      if (rstd != nullptr) rstd[r] = rs;
    }
  }
}

/// dx of layer norm, one warp per row: the two row means, then dx (+)= rstd (g - mean(g) - xhat mean(g xhat)).
template <class D, bool Acc>
__global__ void layer_norm_backward_kernel(const D* x, const D* weight, const float* mean, const float* rstd,
                                           const D* dy, D* dx, std::int64_t rows, int c) {
  constexpr int P = Pack<D>::size;
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t r = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const D* xr = x + r * c;    // (C,)
    const D* dyr = dy + r * c;  // (C,)
    D* dxr = dx + r * c;        // (C,)
    const int head =
        co_aligned(xr, dyr) && co_aligned(xr, dxr) && co_aligned(xr, weight) ? pack_head<D>(xr) : -1;
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.f, sgx = 0.f;
    row_loop<D>(
        c, head, lane, 32,
        [&](int i) {
          const float g = to_float(dyr[i]) * to_float(weight[i]);
          sg += g;
          sgx += g * ((to_float(xr[i]) - mu) * rs);
        },
        [&](int i) {
          const Pack<D> px = load_pack(xr + i), pd = load_pack(dyr + i), pw = load_pack(weight + i);
#pragma unroll
          for (int e = 0; e < P; ++e) {
            const float g = to_float(pd.v[e]) * to_float(pw.v[e]);
            sg += g;
            sgx += g * ((to_float(px.v[e]) - mu) * rs);
          }
        });
    const float g_mean = warp_sum(sg) / static_cast<float>(c);
    const float gx_mean = warp_sum(sgx) / static_cast<float>(c);
    row_loop<D>(
        c, head, lane, 32,
        [&](int i) {
          const float g = to_float(dyr[i]) * to_float(weight[i]);
          const float xhat = (to_float(xr[i]) - mu) * rs;
          float d = rs * (g - g_mean - xhat * gx_mean);
          if constexpr (Acc) d += to_float(dxr[i]);
          dxr[i] = from_float<D>(d);
        },
        [&](int i) {
          const Pack<D> px = load_pack(xr + i), pd = load_pack(dyr + i), pw = load_pack(weight + i);
          Pack<D> po;
          if constexpr (Acc) po = load_pack(static_cast<const D*>(dxr) + i);
#pragma unroll
          for (int e = 0; e < P; ++e) {
            const float g = to_float(pd.v[e]) * to_float(pw.v[e]);
            const float xhat = (to_float(px.v[e]) - mu) * rs;
            float d = rs * (g - g_mean - xhat * gx_mean);
            if constexpr (Acc) d += to_float(po.v[e]);
            po.v[e] = from_float<D>(d);
          }
          store_pack(dxr + i, po);
        });
  }
}

void check_rows(const char* op, std::int64_t rows, std::int64_t cols) {
  check_count(op, "rows", rows);
  check_width(op, "the row length", cols);
}
/// As check_rows, for rows `ld` elements apart.
void check_rows(const char* op, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  check_rows(op, rows, cols);
  POLYSHARD_CHECK(ld >= cols, op, ": rows ", ld, " elements apart are shorter than their ", cols, " columns");
}

// ---- grouped-query key-value sharing -----------------------------------------------------------

/// One thread per element of qkv (rows, 3C), grid-stride: q copied, each key-value head read by
/// its group of `group` query heads.
template <class D>
__global__ void grouped_qkv_forward_kernel(const D* q, const D* k, const D* v, D* qkv, std::int64_t rows,
                                           std::int64_t c, std::int64_t head_dim, std::int64_t group) {
  const std::int64_t width = 3 * c, ckv = c / group, n = rows * width;
  for (std::int64_t idx = global_thread(); idx < n; idx += grid_threads()) {
    const std::int64_t row = idx / width, col = idx % width, part = col / c, j = col % c;
    if (part == 0) {
      qkv[idx] = q[row * c + j];
    } else {
      const std::int64_t from = row * ckv + (j / head_dim) / group * head_dim + j % head_dim;
      qkv[idx] = part == 1 ? k[from] : v[from];
    }
  }
}

/// One thread per element of out (part 0: dq, (rows, C); 1 and 2: dk and dv, (rows, C / group)):
/// the q part copied, or a key-value element's group of copies summed in head order, in float.
template <class D>
__global__ void grouped_qkv_backward_kernel(const D* dqkv, D* out, bool accumulate, int part, std::int64_t rows,
                                            std::int64_t c, std::int64_t head_dim, std::int64_t group) {
  const std::int64_t width = part == 0 ? c : c / group, n = rows * width;
  for (std::int64_t idx = global_thread(); idx < n; idx += grid_threads()) {
    const std::int64_t row = idx / width, j = idx % width;
    const D* in = dqkv + row * 3 * c + part * c;
    float s = 0.f;
    if (part == 0) {
      s = to_float(in[j]);
    } else {
      const std::int64_t first = (j / head_dim) * group * head_dim + j % head_dim;
      for (std::int64_t g = 0; g < group; ++g) s += to_float(in[first + g * head_dim]);
    }
    if (accumulate) s += to_float(out[idx]);
    out[idx] = from_float<D>(s);
  }
}

// ---- rotary position embedding ----------------------------------------------------------------

/// One thread per pair (row, i), grid-stride: the pair (i, i + d/2) of the row at position
/// ((row / heads) % positions) + offset turns by sign * that position * theta^(-2i/d). Angle,
/// cosine and sine in double, as the CPU twin computes them.
template <class D, bool Acc>
__global__ void rope_kernel(const D* x, D* out, std::int64_t rows, std::int64_t positions, std::int64_t heads,
                            std::int64_t head_dim, double theta, std::int64_t offset, double sign) {
  const std::int64_t half = head_dim / 2, pairs = rows * half;
  for (std::int64_t k = global_thread(); k < pairs; k += grid_threads()) {
    const std::int64_t row = k / half, i = k % half;
    const std::int64_t p = (row / heads) % positions + offset;
    const double angle = sign * (double(p) * pow(theta, -2.0 * double(i) / double(head_dim)));
    const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sin(angle));
    const D* xr = x + row * head_dim;
    D* yr = out + row * head_dim;
    const float lo_in = to_float(xr[i]), hi_in = to_float(xr[i + half]);
    float lo = lo_in * c - hi_in * s, hi = hi_in * c + lo_in * s;
    if constexpr (Acc) {
      lo += to_float(yr[i]);
      hi += to_float(yr[i + half]);
    }
    yr[i] = from_float<D>(lo);
    yr[i + half] = from_float<D>(hi);
  }
}

// ---- RMS norm -------------------------------------------------------------------------------

/// One warp per row (grid-stride over rows, warp-uniform): the sum of squares, then y.
template <class D>
__global__ void rms_norm_forward_kernel(const D* x, const D* weight, float eps, D* y, float* rstd, std::int64_t rows,
                                        int c) {
  constexpr int P = Pack<D>::size;
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t r = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const D* xr = x + r * c;  // (C,)
    D* yr = y + r * c;        // (C,)
    const int head = co_aligned(xr, yr) && co_aligned(xr, weight) ? pack_head<D>(xr) : -1;
    float ss = 0.f;
    row_loop<D>(
        c, head, lane, 32,
        [&](int i) {
          const float v = to_float(xr[i]);
          ss += v * v;
        },
        [&](int i) {
          const Pack<D> p = load_pack(xr + i);
#pragma unroll
          for (int e = 0; e < P; ++e) {
            const float v = to_float(p.v[e]);
            ss += v * v;
          }
        });
    const float rs = 1.f / sqrtf(warp_sum(ss) / static_cast<float>(c) + eps);
    row_loop<D>(
        c, head, lane, 32, [&](int i) { yr[i] = from_float<D>(to_float(xr[i]) * rs * to_float(weight[i])); },
        [&](int i) {
          const Pack<D> px = load_pack(xr + i), pw = load_pack(weight + i);
          Pack<D> py;
#pragma unroll
          for (int e = 0; e < P; ++e) py.v[e] = from_float<D>(to_float(px.v[e]) * rs * to_float(pw.v[e]));
          store_pack(yr + i, py);
        });
    if (lane == 0 && rstd != nullptr) rstd[r] = rs;
  }
}

/// dx of RMS norm, one warp per row: mean(g xhat), then dx (+)= rstd (g - xhat mean(g xhat)).
template <class D, bool Acc>
__global__ void rms_norm_backward_kernel(const D* x, const D* weight, const float* rstd, const D* dy, D* dx,
                                         std::int64_t rows, int c) {
  constexpr int P = Pack<D>::size;
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t r = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const D* xr = x + r * c;    // (C,)
    const D* dyr = dy + r * c;  // (C,)
    D* dxr = dx + r * c;        // (C,)
    const int head =
        co_aligned(xr, dyr) && co_aligned(xr, dxr) && co_aligned(xr, weight) ? pack_head<D>(xr) : -1;
    const float rs = rstd[r];
    float sgx = 0.f;
    row_loop<D>(
        c, head, lane, 32, [&](int i) { sgx += to_float(dyr[i]) * to_float(weight[i]) * (to_float(xr[i]) * rs); },
        [&](int i) {
          const Pack<D> px = load_pack(xr + i), pd = load_pack(dyr + i), pw = load_pack(weight + i);
#pragma unroll
          for (int e = 0; e < P; ++e) sgx += to_float(pd.v[e]) * to_float(pw.v[e]) * (to_float(px.v[e]) * rs);
        });
    const float gx_mean = warp_sum(sgx) / static_cast<float>(c);
    row_loop<D>(
        c, head, lane, 32,
        [&](int i) {
          float d = rs * (to_float(dyr[i]) * to_float(weight[i]) - to_float(xr[i]) * rs * gx_mean);
          if constexpr (Acc) d += to_float(dxr[i]);
          dxr[i] = from_float<D>(d);
        },
        [&](int i) {
          const Pack<D> px = load_pack(xr + i), pd = load_pack(dyr + i), pw = load_pack(weight + i);
          Pack<D> po;
          if constexpr (Acc) po = load_pack(static_cast<const D*>(dxr) + i);
#pragma unroll
          for (int e = 0; e < P; ++e) {
            float d = rs * (to_float(pd.v[e]) * to_float(pw.v[e]) - to_float(px.v[e]) * rs * gx_mean);
            if constexpr (Acc) d += to_float(po.v[e]);
            po.v[e] = from_float<D>(d);
          }
          store_pack(dxr + i, po);
        });
  }
}

// ---- softmax --------------------------------------------------------------------------------

/// One block per row (grid-stride, block-uniform): max, sum of exp, then y = exp(x - max) / sum.
/// Over `n` columns of rows `stride` apart; `scale` multiplies x first. Writes zeros to columns
/// [n, zero_to) (the masked keys of the causal softmax).
template <class D>
__device__ __forceinline__ void softmax_row(const D* xr, D* yr, int n, float scale, int zero_to, float* red) {
  constexpr int P = Pack<D>::size;
  const int head = co_aligned(xr, yr) ? pack_head<D>(xr) : -1;
  float m = -INFINITY;
  row_loop<D>(
      n, head, threadIdx.x, blockDim.x, [&](int i) { m = fmaxf(m, scale * to_float(xr[i])); },
      [&](int i) {
        const Pack<D> p = load_pack(xr + i);
#pragma unroll
        for (int e = 0; e < P; ++e) m = fmaxf(m, scale * to_float(p.v[e]));
      });
  m = block_max(m, red);
  float s = 0.f;
  row_loop<D>(
      n, head, threadIdx.x, blockDim.x, [&](int i) { s += expf(scale * to_float(xr[i]) - m); },
      [&](int i) {
        const Pack<D> p = load_pack(xr + i);
#pragma unroll
        for (int e = 0; e < P; ++e) s += expf(scale * to_float(p.v[e]) - m);
      });
  const float inv = 1.f / block_sum(s, red);  // synchronises: every read of x above is done
  row_loop<D>(
      n, head, threadIdx.x, blockDim.x, [&](int i) { yr[i] = from_float<D>(expf(scale * to_float(xr[i]) - m) * inv); },
      [&](int i) {
        const Pack<D> p = load_pack(xr + i);
        Pack<D> o;
#pragma unroll
        for (int e = 0; e < P; ++e) o.v[e] = from_float<D>(expf(scale * to_float(p.v[e]) - m) * inv);
        store_pack(yr + i, o);
      });
  for (int i = n + threadIdx.x; i < zero_to; i += blockDim.x) yr[i] = from_float<D>(0.f);
}

/// dx (+)= scale * y (dy - sum(dy y)) over `n` columns; columns [n, zero_to) of dx are set to 0
/// unless accumulating.
template <class D, bool Acc>
__device__ __forceinline__ void softmax_backward_row(const D* yr, const D* dyr, D* dxr, int n, float scale,
                                                     int zero_to, float* red) {
  constexpr int P = Pack<D>::size;
  const int head = co_aligned(yr, dyr) && co_aligned(yr, dxr) ? pack_head<D>(yr) : -1;
  float dot = 0.f;
  row_loop<D>(
      n, head, threadIdx.x, blockDim.x, [&](int i) { dot += to_float(yr[i]) * to_float(dyr[i]); },
      [&](int i) {
        const Pack<D> py = load_pack(yr + i), pd = load_pack(dyr + i);
#pragma unroll
        for (int e = 0; e < P; ++e) dot += to_float(py.v[e]) * to_float(pd.v[e]);
      });
  dot = block_sum(dot, red);  // synchronises: every read of dy above is done (dx may alias dy)
  row_loop<D>(
      n, head, threadIdx.x, blockDim.x,
      [&](int i) {
        float d = scale * (to_float(yr[i]) * (to_float(dyr[i]) - dot));
        if constexpr (Acc) d += to_float(dxr[i]);
        dxr[i] = from_float<D>(d);
      },
      [&](int i) {
        const Pack<D> py = load_pack(yr + i), pd = load_pack(dyr + i);
        Pack<D> po;
        if constexpr (Acc) po = load_pack(static_cast<const D*>(dxr) + i);
#pragma unroll
        for (int e = 0; e < P; ++e) {
          float d = scale * (to_float(py.v[e]) * (to_float(pd.v[e]) - dot));
          if constexpr (Acc) d += to_float(po.v[e]);
          po.v[e] = from_float<D>(d);
        }
        store_pack(dxr + i, po);
      });
  if constexpr (!Acc)
    for (int i = n + threadIdx.x; i < zero_to; i += blockDim.x) dxr[i] = from_float<D>(0.f);
}

template <class D>
__global__ void __launch_bounds__(wide_row_threads) softmax_forward_kernel(const D* x, D* y, std::int64_t rows, int n) {
  POLYSHARD_SHARED(float, red, [32]);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) softmax_row(x + r * n, y + r * n, n, 1.f, n, red);
}

template <class D, bool Acc>
__global__ void __launch_bounds__(wide_row_threads)
    softmax_backward_kernel(const D* y, const D* dy, D* dx, std::int64_t rows, int n) {
  POLYSHARD_SHARED(float, red, [32]);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    softmax_backward_row<D, Acc>(y + r * n, dy + r * n, dx + r * n, n, 1.f, n, red);
}

/// Row r of (BH, T, T) is query r % T: it sees keys [0, r % T].
template <class D>
__global__ void __launch_bounds__(wide_row_threads)
    causal_softmax_forward_kernel(const D* scores, float scale, D* probs, std::int64_t rows, int t) {
  POLYSHARD_SHARED(float, red, [32]);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    softmax_row(scores + r * t, probs + r * t, static_cast<int>(r % t) + 1, scale, t, red);
}

template <class D, bool Acc>
__global__ void __launch_bounds__(wide_row_threads)
    causal_softmax_backward_kernel(const D* probs, const D* dprobs, float scale, D* dscores, std::int64_t rows, int t) {
  POLYSHARD_SHARED(float, red, [32]);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    softmax_backward_row<D, Acc>(probs + r * t, dprobs + r * t, dscores + r * t, static_cast<int>(r % t) + 1, scale,
                                 t, red);
}

// ---- attention layout glue ------------------------------------------------------------------
// Unit u walks a (B, H, T, D / W) layout (W = 1, or a 16-byte pack when D and every pointer
// allow); its offset is u * W there and (b T + t) ld + h D + j W in a (B, T, ld) tensor.

__device__ __forceinline__ std::int64_t token_major_offset(std::int64_t u, std::int64_t t, std::int64_t h,
                                                           std::int64_t d, int w, std::int64_t ld) {
  const std::int64_t units_per_head_row = d / w;
  const std::int64_t j = u % units_per_head_row;
  std::int64_t rest = u / units_per_head_row;
  const std::int64_t tt = rest % t;
  rest /= t;
  const std::int64_t hh = rest % h, bb = rest / h;
  return (bb * t + tt) * ld + hh * d + j * w;
}

template <class D, int W>
__global__ void attention_permute_forward_kernel(const D* qkv, D* q, D* k, D* v, std::int64_t b, std::int64_t t,
                                                 std::int64_t h, std::int64_t d) {
  const std::int64_t c = h * d, units = b * h * t * (d / W);
  for (std::int64_t u = global_thread(); u < units; u += grid_threads()) {
    const D* src = qkv + token_major_offset(u, t, h, d, W, 3 * c);
    move_unit<D, W, false>(src, q + u * W);
    move_unit<D, W, false>(src + c, k + u * W);
    move_unit<D, W, false>(src + 2 * c, v + u * W);
  }
}

template <class D, int W, bool Acc>
__global__ void attention_permute_backward_kernel(const D* dq, const D* dk, const D* dv, D* dqkv, std::int64_t b,
                                                  std::int64_t t, std::int64_t h, std::int64_t d) {
  const std::int64_t c = h * d, units = b * h * t * (d / W);
  for (std::int64_t u = global_thread(); u < units; u += grid_threads()) {
    D* dst = dqkv + token_major_offset(u, t, h, d, W, 3 * c);
    move_unit<D, W, Acc>(dq + u * W, dst);
    move_unit<D, W, Acc>(dk + u * W, dst + c);
    move_unit<D, W, Acc>(dv + u * W, dst + 2 * c);
  }
}

template <class D, int W>
__global__ void attention_unpermute_forward_kernel(const D* y, D* out, std::int64_t b, std::int64_t t, std::int64_t h,
                                                   std::int64_t d) {
  const std::int64_t units = b * h * t * (d / W);
  for (std::int64_t u = global_thread(); u < units; u += grid_threads())
    move_unit<D, W, false>(y + u * W, out + token_major_offset(u, t, h, d, W, h * d));
}

template <class D, int W>
__global__ void attention_unpermute_backward_kernel(const D* dout, D* dy, std::int64_t b, std::int64_t t,
                                                    std::int64_t h, std::int64_t d) {
  const std::int64_t units = b * h * t * (d / W);
  for (std::int64_t u = global_thread(); u < units; u += grid_threads())
    move_unit<D, W, false>(dout + token_major_offset(u, t, h, d, W, h * d), dy + u * W);
}

void check_attention(const char* op, std::int64_t b, std::int64_t t, std::int64_t n_head, std::int64_t head_dim) {
  check_count(op, "batch B", b);
  check_count(op, "sequence length T", t);
  POLYSHARD_CHECK(n_head > 0, op, ": n_head must be positive, got ", n_head);
  POLYSHARD_CHECK(head_dim > 0, op, ": head_dim must be positive, got ", head_dim);
}

// ---- cross-entropy --------------------------------------------------------------------------

/// Adds x to a running (max m, sum s of exp(. - m)). NaN logits make s NaN (as on the CPU).
__device__ __forceinline__ void online_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.f;  // m = -inf at first: expf(-inf) = 0
    m = x;
  } else {
    s += x == -INFINITY ? 0.f : expf(x - m);
  }
}

/// Adds a pack's values to a running (max m, sum s) with one rescale: the pack's maximum first,
/// then one exponential a value. A pack with a non-finite value takes online_add's way, whose
/// infinities and NaNs the CPU op matches.
template <class D>
__device__ __forceinline__ void online_add_pack(float& m, float& s, const Pack<D>& p) {
  constexpr int P = Pack<D>::size;
  float x[P];
  bool finite = true;
  float top = m;
#pragma unroll
  for (int e = 0; e < P; ++e) {
    x[e] = to_float(p.v[e]);
    finite = finite && fabsf(x[e]) < INFINITY;  // false for infinities and NaN
    top = fmaxf(top, x[e]);
  }
  if (!finite) {
#pragma unroll
    for (int e = 0; e < P; ++e) online_add(m, s, x[e]);
    return;
  }
  float sum = m == -INFINITY ? 0.f : s * expf(m - top);
#pragma unroll
  for (int e = 0; e < P; ++e) sum += expf(x[e] - top);
  m = top;
  s = sum;
}

/// The gradient of one logit: g (exp(x - lse) - [i == target]), plus the old value when accumulating.
template <class D, bool Acc>
__device__ __forceinline__ D ce_grad(float x, float lse, float g, bool is_target, D old) {
  float d = expf(x - lse) * g;
  if (is_target) d -= g;
  if constexpr (Acc) d += to_float(old);
  return from_float<D>(d);
}

/// Writes dlogits of one row from its lse (block-wide).
template <class D, bool Acc>
__device__ __forceinline__ void ce_backward_row(const D* lr, D* dr, int v, int target, float lse, float g, int head) {
  constexpr int P = Pack<D>::size;
  row_loop<D>(
      v, head, threadIdx.x, blockDim.x,
      [&](int i) { dr[i] = ce_grad<D, Acc>(to_float(lr[i]), lse, g, i == target, Acc ? dr[i] : D{}); },
      [&](int i) {
        const Pack<D> px = load_pack(lr + i);
        Pack<D> po;
        if constexpr (Acc) po = load_pack(static_cast<const D*>(dr) + i);
#pragma unroll
        for (int e = 0; e < P; ++e)
          po.v[e] = ce_grad<D, Acc>(to_float(px.v[e]), lse, g, i + e == target, Acc ? po.v[e] : D{});
        store_pack(dr + i, po);
      });
}

/// One block per row: online max and sum, the loss and lse; with Grad, then dlogits (which may
/// be the logits: thread 0 reads the target logit before the block synchronises, and every
/// element is read and written by one thread after it).
template <class D, bool Grad, bool Acc>
__global__ void __launch_bounds__(wide_row_threads)
    cross_entropy_forward_kernel(const D* logits, std::int64_t ld, const int* targets, float* losses, float* lse_out,
                                 const float* dlosses, float dloss_scale, D* dlogits, std::int64_t rows, int v) {
  constexpr int P = Pack<D>::size;
  POLYSHARD_SHARED(float, red, [32]);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const D* lr = logits + r * ld;  // (V,)
    const int target = targets[r];
    const bool valid = target >= 0 && target < v;
    const float x_target = threadIdx.x == 0 && valid ? to_float(lr[target]) : 0.f;
    int head = pack_head<D>(lr);
    if constexpr (Grad) head = co_aligned(lr, dlogits + r * ld) ? head : -1;
    float m = -INFINITY, s = 0.f;
    // row_loop's order, with U packs' loads in flight at once: one at a time, a thread waits a
    // memory round trip per pack.
    int vec_begin = v, vec_end = v;
    if (head >= 0 && head < v) {
      vec_begin = head;
      vec_end = head + (v - head) / P * P;
    }
    for (int i = threadIdx.x; i < vec_begin; i += blockDim.x) online_add(m, s, to_float(lr[i]));
    constexpr int U = 4;
    const int stride = static_cast<int>(blockDim.x) * P;
    for (int i = vec_begin + static_cast<int>(threadIdx.x) * P; i < vec_end; i += U * stride) {
      Pack<D> p[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i + u * stride < vec_end) p[u] = load_pack(lr + i + u * stride);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i + u * stride < vec_end) online_add_pack(m, s, p[u]);
    }
    for (int i = vec_end + threadIdx.x; i < v; i += blockDim.x) online_add(m, s, to_float(lr[i]));
    const float row_max = block_max(m, red);
    const float total = block_sum(s == 0.f ? 0.f : s * expf(m - row_max), red);
    const float lse = row_max + logf(total);
    if (threadIdx.x == 0) {
      losses[r] = valid ? lse - x_target : quiet_nan();
      if (lse_out != nullptr) lse_out[r] = lse;
    }
    if constexpr (Grad) {
      const float g = dlosses != nullptr ? dloss_scale * dlosses[r] : dloss_scale;
      ce_backward_row<D, Acc>(lr, dlogits + r * ld, v, valid ? target : -1, lse, g, head);
    }
  }
}

/// cross_entropy_forward_kernel<D, true, false> for rows of which two fit in a block's shared
/// memory: each row crosses memory once each way, where the streaming kernel reads it twice.
/// One block runs an SM (the two rows take its shared memory), and the grid is one block an SM,
/// each taking rows in turn: while the block works on one row, the next streams into the other
/// half of `staged` by cp.async, so that the read of one row overlaps the arithmetic and the
/// write of the one before. The row's three passes (max, sum, gradient) read it from shared
/// memory, which takes a pass of a 50,304-wide bf16 row in about 800 cycles; held in registers
/// instead, the row left too few for the arithmetic, which spilled.
///
/// Each thread stages, and reads, exactly the packs at first + k stride, so its own wait makes
/// them visible to it. It stages the next row after the block's first barrier of the row: every
/// thread has then finished reading that half in the row before last.
///
/// With the row at hand, the max comes first and each value takes two base-2 exponentials,
/// (x - max) log2(e) for the sum and (x - lse) log2(e) for the gradient, where the online sum
/// takes more and costlier ones. Non-finite values give what the streaming kernel gives: a NaN
/// makes the row's lse NaN, an infinite max makes it that max. Rows start 16-byte aligned (ld a
/// multiple of the pack), and dlogits sits where the logits do or at the same alignment; every
/// element is read and written by one thread, and thread 0 reads the target logit before the
/// block synchronises, so dlogits may be the logits (a row is staged before any of it is written,
/// and only its block writes it).
template <class D>
__global__ void __launch_bounds__(wide_row_threads, 1)
    cross_entropy_staged_kernel(const D* logits, std::int64_t ld, const int* targets, float* losses, float* lse_out,
                                float dloss_scale, D* dlogits, std::int64_t rows, int v) {
  constexpr int P = Pack<D>::size;
  constexpr float log2e = 1.4426950408889634f;
  POLYSHARD_SHARED(float, red, [32]);
  POLYSHARD_DYNAMIC_SHARED(D, staged);  // two rows' whole packs, packed_end values each
  const int packed_end = v / P * P;     // whole packs; then fewer than P elements, one a thread
  const int first = static_cast<int>(threadIdx.x) * P, stride = static_cast<int>(blockDim.x) * P;
  const int tail = packed_end + static_cast<int>(threadIdx.x);
  const auto stage = [&](std::int64_t r, D* half) {
    const D* lr = logits + r * ld;
    for (int i = first; i < packed_end; i += stride) copy_async<16>(half + i, lr + i, true);
    copy_async_commit();
  };
  int half = 0;
  if (blockIdx.x < rows) stage(blockIdx.x, staged);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x, half ^= 1) {
    const D* row = staged + std::ptrdiff_t(half) * packed_end;  // this row's packs
    const D* lr = logits + r * ld;                              // (V,)
    D* dr = dlogits + r * ld;                                   // (V,)
    const int target = targets[r];
    const bool valid = target >= 0 && target < v;
    const float x_target = threadIdx.x == 0 && valid ? to_float(lr[target]) : 0.f;
    const float x_tail = tail < v ? to_float(lr[tail]) : -INFINITY;
    copy_async_wait<0>();
    float m = x_tail;  // NaNs are passed over here and reach the sum below
    for (int i = first; i < packed_end; i += stride) {
      const Pack<D> p = load_pack(row + i);
#pragma unroll
      for (int e = 0; e < P; ++e) m = fmaxf(m, to_float(p.v[e]));
    }
    const float row_max = block_max(m, red);
    if (r + gridDim.x < rows) stage(r + gridDim.x, staged + std::ptrdiff_t(half ^ 1) * packed_end);
    float s = tail < v ? exp2f((x_tail - row_max) * log2e) : 0.f;
    for (int i = first; i < packed_end; i += stride) {
      const Pack<D> p = load_pack(row + i);
#pragma unroll
      for (int e = 0; e < P; ++e) s += exp2f((to_float(p.v[e]) - row_max) * log2e);
    }
    const float total = block_sum(s, red);
    const bool infinite = row_max == INFINITY || row_max == -INFINITY;
    const float lse = infinite ? row_max : row_max + logf(total);  // as the online sum ends
    if (threadIdx.x == 0) {
      losses[r] = valid ? lse - x_target : quiet_nan();
      if (lse_out != nullptr) lse_out[r] = lse;
    }
    const int t = valid ? target : -1;
    const auto grad = [&](float x, bool is_target) {
      float d = exp2f((x - lse) * log2e) * dloss_scale;
      if (is_target) d -= dloss_scale;
      return from_float<D>(d);
    };
    for (int i = first; i < packed_end; i += stride) {
      const Pack<D> p = load_pack(row + i);
      Pack<D> out;
#pragma unroll
      for (int e = 0; e < P; ++e) out.v[e] = grad(to_float(p.v[e]), i + e == t);
      store_pack(dr + i, out);
    }
    if (tail < v) dr[tail] = grad(x_tail, tail == t);
  }
}

/// The shared memory cross_entropy_staged_kernel takes for rows of v values: two rows' whole
/// packs.
template <class D>
std::size_t staged_bytes(std::int64_t v) {
  return 2 * std::size_t(v / Pack<D>::size * Pack<D>::size) * sizeof(D);
}

/// The launch of cross_entropy_staged_kernel on the current device: one block an SM (or one a
/// row, for fewer rows), or a grid of 0 blocks where two rows do not fit in a block's shared
/// memory beside its reduction buffer.
template <class D>
unsigned staged_grid(std::int64_t rows, std::int64_t v) {
  int device = 0, sms = 0, shared = 0;
  POLYSHARD_CUDA_CHECK(cudaGetDevice(&device));
  POLYSHARD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  POLYSHARD_CUDA_CHECK(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (staged_bytes<D>(v) + 32 * sizeof(float) > std::size_t(shared)) return 0;
  return static_cast<unsigned>(std::min<std::int64_t>(rows, std::max(sms, 1)));
}

template <class D, bool Acc>
__global__ void __launch_bounds__(wide_row_threads)
    cross_entropy_backward_kernel(const D* logits, std::int64_t ld, const int* targets, const float* lse,
                                  const float* dlosses, float dloss_scale, const D* dloss, D* dlogits,
                                  std::int64_t rows, int v) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const D* lr = logits + r * ld;  // (V,)
    D* dr = dlogits + r * ld;       // (V,)
    const int target = targets[r];
    const int head = co_aligned(lr, dr) ? pack_head<D>(lr) : -1;
    const float g = (dlosses != nullptr ? dloss_scale * dlosses[r] : dloss_scale) * (dloss ? to_float(*dloss) : 1.f);
    ce_backward_row<D, Acc>(lr, dr, v, target >= 0 && target < v ? target : -1, lse[r], g, head);
  }
}

/// out[0] = the mean of x[0, n), summed in double in a fixed order (one block), rounded to D.
template <class D>
__global__ void __launch_bounds__(1024) mean_of_floats_kernel(const float* x, std::int64_t n, D* out) {
  POLYSHARD_SHARED(double, red, [32]);
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *out = from_float<D>(static_cast<float>(s / double(n)));
}

template <class T>
void launch_cross_entropy(const char* op, const T* logits, std::int64_t ld, const std::int32_t* targets, float* losses,
                          float* lse, const float* dlosses, float dloss_scale, DeviceGradOut<T> dlogits,
                          std::int64_t rows, std::int64_t v, cudaStream_t stream) {
  using D = device_t<T>;
  check_rows(op, rows, v, ld);
  if (rows == 0) return;
  check_pointer(op, "logits", logits);
  check_pointer(op, "targets", targets);
  check_pointer(op, "losses", losses);
  const unsigned grid = grid_for(static_cast<std::size_t>(rows), 1);
  const int threads = row_threads(v);
  const D* l = device_ptr(logits);
  if (!dlogits.wanted()) {
    launch<cross_entropy_forward_kernel<D, false, false>>(grid, threads, 0, stream, l, ld, targets, losses, lse,
                                                          dlosses, dloss_scale, nullptr, rows, int(v));
  } else if (dlogits.accumulate) {
    launch<cross_entropy_forward_kernel<D, true, true>>(grid, threads, 0, stream, l, ld, targets, losses, lse, dlosses,
                                                        dloss_scale, device_ptr(dlogits.data), rows, int(v));
  } else if (const unsigned staged_blocks = staged_grid<D>(rows, v);
             dlosses == nullptr && ld % Pack<D>::size == 0 && all_aligned16(logits, dlogits.data) &&
             staged_blocks > 0) {
    allow_dynamic_shared<cross_entropy_staged_kernel<D>>(staged_bytes<D>(v));
    launch<cross_entropy_staged_kernel<D>>(staged_blocks, wide_row_threads, staged_bytes<D>(v), stream, l, ld, targets,
                                           losses, lse, dloss_scale, device_ptr(dlogits.data), rows, int(v));
  } else {
    launch<cross_entropy_forward_kernel<D, true, false>>(grid, threads, 0, stream, l, ld, targets, losses, lse,
                                                         dlosses, dloss_scale, device_ptr(dlogits.data), rows, int(v));
  }
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* out, std::int64_t n, std::int64_t v,
                       std::int64_t c, cudaStream_t stream) {
  using D = device_t<T>;
  constexpr int P = Pack<D>::size;
  check_embedding_sizes("embedding", n, v, c);
  if (n == 0) return;
  if (c % P == 0 && all_aligned16(table, out)) {
    launch<embedding_forward_kernel<D, P>>(grid_for(static_cast<std::size_t>(n * (c / P)), block_threads),
                                           block_threads, 0, stream, ids, device_ptr(table), device_ptr(out), n, v, c);
  } else {
    launch<embedding_forward_kernel<D, 1>>(grid_for(static_cast<std::size_t>(n * c), block_threads), block_threads, 0,
                                           stream, ids, device_ptr(table), device_ptr(out), n, v, c);
  }
  POLYSHARD_CUDA_CHECK_LAUNCH("embedding");
}

std::size_t embedding_backward_workspace_bytes(std::int64_t n, std::int64_t v) {
  check_embedding_sizes("embedding backward", n, v, 1);
  return embedding_workspace(n, v, nullptr).total_bytes;
}

template <class T>
void embedding_backward(const std::int32_t* ids, const T* dout, DeviceGradOut<T> dtable, std::int64_t n,
                        std::int64_t v, std::int64_t c, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream) {
  using D = device_t<T>;
  const char* op = "embedding backward";
  if (!dtable.wanted()) return;
  check_embedding_sizes(op, n, v, c);
  const EmbeddingWorkspace w = embedding_workspace(n, v, workspace);
  POLYSHARD_CHECK(n == 0 || (workspace != nullptr && workspace_bytes >= w.total_bytes), op, ": needs a workspace of ",
                  w.total_bytes, " bytes for ", n, " ids, got ", workspace_bytes, workspace ? "" : " (null)");
  if (!dtable.accumulate)
    POLYSHARD_CUDA_CHECK(cudaMemsetAsync(dtable.data, 0, static_cast<std::size_t>(v * c) * sizeof(D), stream));
  if (n == 0) return;
  launch<embedding_backward_keys_kernel>(grid_for(static_cast<std::size_t>(n), block_threads), block_threads, 0, stream,
                                         ids, w.keys_in, w.positions_in, static_cast<int>(n), static_cast<int>(v));
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
  std::size_t temp_bytes = w.sort_temp_bytes;
  POLYSHARD_CUDA_CHECK(sort_pairs(w.sort_temp, temp_bytes, w.keys_in, w.keys_out, w.positions_in, w.positions_out,
                                  static_cast<int>(n), 0, embedding_sort_bits(v), stream));
  launch<embedding_backward_kernel<D>>(grid_for(static_cast<std::size_t>(n), 1), block_threads, 0, stream, w.keys_out,
                                       w.positions_out, device_ptr(dout), device_ptr(dtable.data), static_cast<int>(n),
                                       static_cast<unsigned>(v), c);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, float eps, T* y, float* mean, float* rstd,
                        std::int64_t rows, std::int64_t c, cudaStream_t stream) {
  using D = device_t<T>;
  check_rows("layer_norm", rows, c);
  POLYSHARD_CHECK(eps >= 0.f, "layer_norm: eps must not be negative, got ", eps);
  if (rows == 0) return;
  launch<layer_norm_forward_kernel<D>>(grid_for(static_cast<std::size_t>(rows), warps_per_block), block_threads, 0,
                                       stream, device_ptr(x), device_ptr(weight), device_ptr(bias), eps, device_ptr(y),
                                       mean, rstd, rows, int(c));
  POLYSHARD_CUDA_CHECK_LAUNCH("layer_norm");
}

std::size_t layer_norm_backward_workspace_floats(std::int64_t rows, std::int64_t c) {
  check_rows("layer_norm backward", rows, c);
  return static_cast<std::size_t>(2 * chunk_count(rows) * c);
}

template <class T>
void layer_norm_backward(const T* x, const T* weight, const float* mean, const float* rstd, const T* dy,
                         DeviceGradOut<T> dx, DeviceGradOut<T> dweight, DeviceGradOut<T> dbias, std::int64_t rows,
                         std::int64_t c, float* workspace, std::size_t workspace_floats, cudaStream_t stream) {
  using D = device_t<T>;
  const char* op = "layer_norm backward";
  check_rows(op, rows, c);
  if (dx.wanted() && rows > 0) {
    const unsigned grid = grid_for(static_cast<std::size_t>(rows), warps_per_block);
    if (dx.accumulate)
      launch<layer_norm_backward_kernel<D, true>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(weight),
                                                  mean, rstd, device_ptr(dy), device_ptr(dx.data), rows, int(c));
    else
      launch<layer_norm_backward_kernel<D, false>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(weight),
                                                   mean, rstd, device_ptr(dy), device_ptr(dx.data), rows, int(c));
    POLYSHARD_CUDA_CHECK_LAUNCH(op);
  }
  if (dweight.wanted() || dbias.wanted()) {
    const LayerNormParamTerms<D> terms{device_ptr(x), device_ptr(dy), mean, rstd};
    launch_column_sums(op, terms, rows, c, workspace, workspace_floats, device_ptr(dweight.data), dweight.accumulate,
                       device_ptr(dbias.data), dbias.accumulate, stream);
  }
}

void check_grouped_heads(const char* op, std::int64_t rows, std::int64_t head_dim, std::int64_t n_head,
                         std::int64_t n_kv_head) {
  check_count(op, "rows", rows);
  POLYSHARD_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0, op, ": n_head (", n_head,
                  ") must be a positive multiple of n_kv_head (", n_kv_head, ")");
  check_width(op, "3 * n_head * head_dim", 3 * n_head * head_dim);
}

template <class T>
void grouped_qkv_forward(const T* q, const T* k, const T* v, T* qkv, std::int64_t rows, std::int64_t head_dim,
                         std::int64_t n_head, std::int64_t n_kv_head, cudaStream_t stream) {
  using D = device_t<T>;
  check_grouped_heads("grouped_qkv", rows, head_dim, n_head, n_kv_head);
  const std::int64_t c = n_head * head_dim;
  if (rows == 0) return;
  launch<grouped_qkv_forward_kernel<D>>(grid_for(static_cast<std::size_t>(rows * 3 * c), 1), block_threads, 0, stream,
                                        device_ptr(q), device_ptr(k), device_ptr(v), device_ptr(qkv), rows, c, head_dim,
                                        n_head / n_kv_head);
  POLYSHARD_CUDA_CHECK_LAUNCH("grouped_qkv");
}

template <class T>
void grouped_qkv_backward(const T* dqkv, DeviceGradOut<T> dq, DeviceGradOut<T> dk, DeviceGradOut<T> dv,
                          std::int64_t rows, std::int64_t head_dim, std::int64_t n_head, std::int64_t n_kv_head,
                          cudaStream_t stream) {
  using D = device_t<T>;
  const char* op = "grouped_qkv backward";
  check_grouped_heads(op, rows, head_dim, n_head, n_kv_head);
  const std::int64_t c = n_head * head_dim, group = n_head / n_kv_head;
  if (rows == 0) return;
  const DeviceGradOut<T> outs[3] = {dq, dk, dv};
  for (int part = 0; part < 3; ++part) {
    if (!outs[part].wanted()) continue;
    const std::int64_t width = part == 0 ? c : c / group;
    launch<grouped_qkv_backward_kernel<D>>(grid_for(static_cast<std::size_t>(rows * width), 1), block_threads, 0,
                                           stream, device_ptr(dqkv), device_ptr(outs[part].data),
                                           outs[part].accumulate, part, rows, c, head_dim, group);
    POLYSHARD_CUDA_CHECK_LAUNCH(op);
  }
}

template <class T>
void rope_rotate(const T* x, DeviceGradOut<T> out, std::int64_t batch, std::int64_t positions, std::int64_t heads,
                 std::int64_t head_dim, double theta, std::int64_t offset, bool inverse, cudaStream_t stream) {
  using D = device_t<T>;
  const char* op = inverse ? "rope backward" : "rope";
  check_count(op, "batch", batch);
  check_count(op, "positions", positions);
  check_count(op, "heads", heads);
  POLYSHARD_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= max_width, op,
                  ": head_dim must be even and in [2, 2^30], got ", head_dim);
  POLYSHARD_CHECK(theta > 0.0, op, ": theta must be positive, got ", theta);
  POLYSHARD_CHECK(offset >= 0, op, ": the position offset must not be negative, got ", offset);
  const std::int64_t rows = batch * positions * heads;
  if (rows == 0 || !out.wanted()) return;
  const unsigned grid = grid_for(static_cast<std::size_t>(rows * (head_dim / 2)), 1);
  const double sign = inverse ? -1.0 : 1.0;
  if (out.accumulate)
    launch<rope_kernel<D, true>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(out.data), rows, positions,
                                 heads, head_dim, theta, offset, sign);
  else
    launch<rope_kernel<D, false>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(out.data), rows, positions,
                                  heads, head_dim, theta, offset, sign);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void rms_norm_forward(const T* x, const T* weight, float eps, T* y, float* rstd, std::int64_t rows, std::int64_t c,
                      cudaStream_t stream) {
  using D = device_t<T>;
  check_rows("rms_norm", rows, c);
  POLYSHARD_CHECK(eps >= 0.f, "rms_norm: eps must not be negative, got ", eps);
  if (rows == 0) return;
  launch<rms_norm_forward_kernel<D>>(grid_for(static_cast<std::size_t>(rows), warps_per_block), block_threads, 0, stream,
                                     device_ptr(x), device_ptr(weight), eps, device_ptr(y), rstd, rows, int(c));
  POLYSHARD_CUDA_CHECK_LAUNCH("rms_norm");
}

std::size_t rms_norm_backward_workspace_floats(std::int64_t rows, std::int64_t c) {
  check_rows("rms_norm backward", rows, c);
  return static_cast<std::size_t>(chunk_count(rows) * c);
}

template <class T>
void rms_norm_backward(const T* x, const T* weight, const float* rstd, const T* dy, DeviceGradOut<T> dx,
                       DeviceGradOut<T> dweight, std::int64_t rows, std::int64_t c, float* workspace,
                       std::size_t workspace_floats, cudaStream_t stream) {
  using D = device_t<T>;
  const char* op = "rms_norm backward";
  check_rows(op, rows, c);
  if (dx.wanted() && rows > 0) {
    const unsigned grid = grid_for(static_cast<std::size_t>(rows), warps_per_block);
    if (dx.accumulate)
      launch<rms_norm_backward_kernel<D, true>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(weight), rstd,
                                                device_ptr(dy), device_ptr(dx.data), rows, int(c));
    else
      launch<rms_norm_backward_kernel<D, false>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(weight),
                                                 rstd, device_ptr(dy), device_ptr(dx.data), rows, int(c));
    POLYSHARD_CUDA_CHECK_LAUNCH(op);
  }
  if (dweight.wanted()) {
    const RmsNormWeightTerms<D> terms{device_ptr(x), device_ptr(dy), rstd};
    launch_column_sums(op, terms, rows, c, workspace, workspace_floats, device_ptr(dweight.data), dweight.accumulate,
                       static_cast<D*>(nullptr), false, stream);
  }
}

/// Launches an activation's forward kernel F over n elements.
template <class F, class T>
void launch_activation_forward(const char* op, const T* x, T* y, std::int64_t n, cudaStream_t stream) {
  using D = device_t<T>;
  check_count(op, "n", n);
  if (n == 0) return;
  const bool packs = all_aligned16(x, y);
  launch<activation_forward_kernel<D, F>>(elementwise_grid<D>(n, packs), block_threads, 0, stream, device_ptr(x),
                                          device_ptr(y), n, packs);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

/// Launches an activation's backward kernel B over n elements, if dx is wanted.
template <template <bool> class B, class T>
void launch_activation_backward(const char* op, const T* x, const T* dy, DeviceGradOut<T> dx, std::int64_t n,
                                cudaStream_t stream) {
  using D = device_t<T>;
  check_count(op, "n", n);
  if (n == 0 || !dx.wanted()) return;
  const bool packs = all_aligned16(x, dy, dx.data);
  const unsigned grid = elementwise_grid<D>(n, packs);
  if (dx.accumulate)
    launch<activation_backward_kernel<D, B, true>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(dy),
                                                   device_ptr(dx.data), n, packs);
  else
    launch<activation_backward_kernel<D, B, false>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(dy),
                                                    device_ptr(dx.data), n, packs);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void silu_forward(const T* x, T* y, std::int64_t n, cudaStream_t stream) {
  launch_activation_forward<SiluForward>("silu", x, y, n, stream);
}

template <class T>
void silu_backward(const T* x, const T* dy, DeviceGradOut<T> dx, std::int64_t n, cudaStream_t stream) {
  launch_activation_backward<SiluBackward>("silu backward", x, dy, dx, n, stream);
}

template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n, cudaStream_t stream) {
  launch_activation_forward<GeluForward>("gelu", x, y, n, stream);
}

template <class T>
void gelu_backward(const T* x, const T* dy, DeviceGradOut<T> dx, std::int64_t n, cudaStream_t stream) {
  launch_activation_backward<GeluBackward>("gelu backward", x, dy, dx, n, stream);
}

template <class T>
void add_into(const T* a, const T* b, T* out, std::int64_t n, cudaStream_t stream) {
  using D = device_t<T>;
  check_count("add", "n", n);
  if (n == 0) return;
  const bool packs = all_aligned16(a, b, out);
  launch<add_forward_kernel<D>>(elementwise_grid<D>(n, packs), block_threads, 0, stream, device_ptr(a), device_ptr(b),
                                device_ptr(out), n, packs);
  POLYSHARD_CUDA_CHECK_LAUNCH("add");
}

template <class T>
void add_into_accumulate(const T* x, T* y, std::int64_t n, cudaStream_t stream) {
  using D = device_t<T>;
  check_count("add_into_accumulate", "n", n);
  if (n == 0) return;
  const bool packs = all_aligned16(x, y);
  launch<add_accumulate_forward_kernel<D>>(elementwise_grid<D>(n, packs), block_threads, 0, stream, device_ptr(x),
                                           device_ptr(y), n, packs);
  POLYSHARD_CUDA_CHECK_LAUNCH("add_into_accumulate");
}

template <class T>
void scale_into(const T* x, double s, T* out, std::int64_t n, cudaStream_t stream) {
  using D = device_t<T>;
  check_count("scale", "n", n);
  if (n == 0) return;
  const bool packs = all_aligned16(x, out);
  launch<scale_forward_kernel<D>>(elementwise_grid<D>(n, packs), block_threads, 0, stream, device_ptr(x),
                                  static_cast<float>(s), device_ptr(out), n, packs);
  POLYSHARD_CUDA_CHECK_LAUNCH("scale");
}

template <class T>
void scale_by_device_scalar(const T* x, const T* dloss, float factor, DeviceGradOut<T> y, std::int64_t n,
                            cudaStream_t stream) {
  using D = device_t<T>;
  const char* op = "scale_by_device_scalar";
  check_count(op, "n", n);
  if (n == 0 || !y.wanted()) return;
  check_pointer(op, "x", x);
  check_pointer(op, "dloss", dloss);
  const bool packs = all_aligned16(x, static_cast<const T*>(y.data));
  const unsigned grid = elementwise_grid<D>(n, packs);
  if (y.accumulate)
    launch<scale_by_device_scalar_kernel<D, true>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(dloss),
                                                   factor, device_ptr(y.data), n, packs);
  else
    launch<scale_by_device_scalar_kernel<D, false>>(grid, block_threads, 0, stream, device_ptr(x), device_ptr(dloss),
                                                    factor, device_ptr(y.data), n, packs);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void mul_into(const T* a, const T* b, T* out, std::int64_t n, cudaStream_t stream) {
  using D = device_t<T>;
  check_count("mul", "n", n);
  if (n == 0) return;
  const bool packs = all_aligned16(a, b, out);
  launch<mul_forward_kernel<D>>(elementwise_grid<D>(n, packs), block_threads, 0, stream, device_ptr(a), device_ptr(b),
                                device_ptr(out), n, packs);
  POLYSHARD_CUDA_CHECK_LAUNCH("mul");
}

template <class T>
void add_scaled_into(const T* x, double s, T* y, std::int64_t n, cudaStream_t stream) {
  using D = device_t<T>;
  check_count("add_scaled", "n", n);
  if (n == 0) return;
  const bool packs = all_aligned16(x, y);
  launch<add_scaled_forward_kernel<D>>(elementwise_grid<D>(n, packs), block_threads, 0, stream, device_ptr(x),
                                       static_cast<float>(s), device_ptr(y), n, packs);
  POLYSHARD_CUDA_CHECK_LAUNCH("add_scaled");
}

template <class T>
void add_bias_rows(T* y, const T* bias, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  check_count("add_bias_rows", "rows", rows);
  check_width("add_bias_rows", "cols", cols);
  if (rows == 0) return;
  const std::int64_t n = rows * cols;
  launch<add_bias_rows_kernel<device_t<T>>>(grid_for(static_cast<std::size_t>(n), block_threads), block_threads, 0,
                                            stream, device_ptr(y), device_ptr(bias), n, cols);
  POLYSHARD_CUDA_CHECK_LAUNCH("add_bias_rows");
}

template <class T>
void sum(const T* x, std::int64_t n, double* out, double* workspace, cudaStream_t stream) {
  check_count("sum", "n", n);
  check_pointer("sum", "out", out);
  check_pointer("sum", "workspace", workspace);
  launch<sum_partials_kernel<device_t<T>>>(sum_blocks, block_threads, 0, stream, device_ptr(x), n, workspace);
  POLYSHARD_CUDA_CHECK_LAUNCH("sum");
  launch<sum_finish_kernel>(1, block_threads, 0, stream, workspace, out);
  POLYSHARD_CUDA_CHECK_LAUNCH("sum (finish)");
}

template <class T>
void softmax_forward(const T* x, T* y, std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  using D = device_t<T>;
  check_rows("softmax", rows, n);
  if (rows == 0) return;
  launch<softmax_forward_kernel<D>>(grid_for(static_cast<std::size_t>(rows), 1), row_threads(n), 0, stream,
                                    device_ptr(x), device_ptr(y), rows, int(n));
  POLYSHARD_CUDA_CHECK_LAUNCH("softmax");
}

template <class T>
void softmax_backward(const T* y, const T* dy, DeviceGradOut<T> dx, std::int64_t rows, std::int64_t n,
                      cudaStream_t stream) {
  using D = device_t<T>;
  check_rows("softmax backward", rows, n);
  if (rows == 0 || !dx.wanted()) return;
  const unsigned grid = grid_for(static_cast<std::size_t>(rows), 1);
  if (dx.accumulate)
    launch<softmax_backward_kernel<D, true>>(grid, row_threads(n), 0, stream, device_ptr(y), device_ptr(dy),
                                             device_ptr(dx.data), rows, int(n));
  else
    launch<softmax_backward_kernel<D, false>>(grid, row_threads(n), 0, stream, device_ptr(y), device_ptr(dy),
                                              device_ptr(dx.data), rows, int(n));
  POLYSHARD_CUDA_CHECK_LAUNCH("softmax backward");
}

template <class T>
void causal_softmax_forward(const T* scores, float scale, T* probs, std::int64_t bh, std::int64_t t,
                            cudaStream_t stream) {
  using D = device_t<T>;
  const char* op = "causal_softmax";
  check_count(op, "batch * n_head", bh);
  check_width(op, "sequence length T", t);
  const std::int64_t rows = bh * t;
  if (rows == 0) return;
  launch<causal_softmax_forward_kernel<D>>(grid_for(static_cast<std::size_t>(rows), 1), row_threads(t), 0, stream,
                                           device_ptr(scores), scale, device_ptr(probs), rows, int(t));
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void causal_softmax_backward(const T* probs, const T* dprobs, float scale, DeviceGradOut<T> dscores,
                             std::int64_t bh, std::int64_t t, cudaStream_t stream) {
  using D = device_t<T>;
  const char* op = "causal_softmax backward";
  check_count(op, "batch * n_head", bh);
  check_width(op, "sequence length T", t);
  const std::int64_t rows = bh * t;
  if (rows == 0 || !dscores.wanted()) return;
  const unsigned grid = grid_for(static_cast<std::size_t>(rows), 1);
  if (dscores.accumulate)
    launch<causal_softmax_backward_kernel<D, true>>(grid, row_threads(t), 0, stream, device_ptr(probs),
                                                    device_ptr(dprobs), scale, device_ptr(dscores.data), rows, int(t));
  else
    launch<causal_softmax_backward_kernel<D, false>>(grid, row_threads(t), 0, stream, device_ptr(probs),
                                                     device_ptr(dprobs), scale, device_ptr(dscores.data), rows, int(t));
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void attention_permute_forward(const T* qkv, T* q, T* k, T* v, std::int64_t b, std::int64_t t, std::int64_t n_head,
                               std::int64_t head_dim, cudaStream_t stream) {
  using D = device_t<T>;
  constexpr int P = Pack<D>::size;
  const char* op = "attention_permute";
  check_attention(op, b, t, n_head, head_dim);
  const std::int64_t elems = b * n_head * t * head_dim;
  if (elems == 0) return;
  if (head_dim % P == 0 && all_aligned16(qkv, q, k, v))
    launch<attention_permute_forward_kernel<D, P>>(grid_for(static_cast<std::size_t>(elems / P), block_threads),
                                                   block_threads, 0, stream, device_ptr(qkv), device_ptr(q),
                                                   device_ptr(k), device_ptr(v), b, t, n_head, head_dim);
  else
    launch<attention_permute_forward_kernel<D, 1>>(grid_for(static_cast<std::size_t>(elems), block_threads),
                                                   block_threads, 0, stream, device_ptr(qkv), device_ptr(q),
                                                   device_ptr(k), device_ptr(v), b, t, n_head, head_dim);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void attention_permute_backward(const T* dq, const T* dk, const T* dv, DeviceGradOut<T> dqkv, std::int64_t b,
                                std::int64_t t, std::int64_t n_head, std::int64_t head_dim, cudaStream_t stream) {
  using D = device_t<T>;
  constexpr int P = Pack<D>::size;
  const char* op = "attention_permute backward";
  check_attention(op, b, t, n_head, head_dim);
  const std::int64_t elems = b * n_head * t * head_dim;
  if (elems == 0 || !dqkv.wanted()) return;
  const D *q = device_ptr(dq), *k = device_ptr(dk), *v = device_ptr(dv);
  D* out = device_ptr(dqkv.data);
  const bool packs = head_dim % P == 0 && all_aligned16(dq, dk, dv, dqkv.data);
  const unsigned grid = grid_for(static_cast<std::size_t>(packs ? elems / P : elems), block_threads);
  if (packs && dqkv.accumulate)
    launch<attention_permute_backward_kernel<D, P, true>>(grid, block_threads, 0, stream, q, k, v, out, b, t, n_head,
                                                          head_dim);
  else if (packs)
    launch<attention_permute_backward_kernel<D, P, false>>(grid, block_threads, 0, stream, q, k, v, out, b, t, n_head,
                                                           head_dim);
  else if (dqkv.accumulate)
    launch<attention_permute_backward_kernel<D, 1, true>>(grid, block_threads, 0, stream, q, k, v, out, b, t, n_head,
                                                          head_dim);
  else
    launch<attention_permute_backward_kernel<D, 1, false>>(grid, block_threads, 0, stream, q, k, v, out, b, t, n_head,
                                                           head_dim);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void attention_unpermute_forward(const T* y, T* out, std::int64_t b, std::int64_t t, std::int64_t n_head,
                                 std::int64_t head_dim, cudaStream_t stream) {
  using D = device_t<T>;
  constexpr int P = Pack<D>::size;
  const char* op = "attention_unpermute";
  check_attention(op, b, t, n_head, head_dim);
  const std::int64_t elems = b * n_head * t * head_dim;
  if (elems == 0) return;
  if (head_dim % P == 0 && all_aligned16(y, out))
    launch<attention_unpermute_forward_kernel<D, P>>(grid_for(static_cast<std::size_t>(elems / P), block_threads),
                                                     block_threads, 0, stream, device_ptr(y), device_ptr(out), b, t,
                                                     n_head, head_dim);
  else
    launch<attention_unpermute_forward_kernel<D, 1>>(grid_for(static_cast<std::size_t>(elems), block_threads),
                                                     block_threads, 0, stream, device_ptr(y), device_ptr(out), b, t,
                                                     n_head, head_dim);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void attention_unpermute_backward(const T* dout, T* dy, std::int64_t b, std::int64_t t, std::int64_t n_head,
                                  std::int64_t head_dim, cudaStream_t stream) {
  using D = device_t<T>;
  constexpr int P = Pack<D>::size;
  const char* op = "attention_unpermute backward";
  check_attention(op, b, t, n_head, head_dim);
  const std::int64_t elems = b * n_head * t * head_dim;
  if (elems == 0) return;
  if (head_dim % P == 0 && all_aligned16(dout, dy))
    launch<attention_unpermute_backward_kernel<D, P>>(grid_for(static_cast<std::size_t>(elems / P), block_threads),
                                                      block_threads, 0, stream, device_ptr(dout), device_ptr(dy), b, t,
                                                      n_head, head_dim);
  else
    launch<attention_unpermute_backward_kernel<D, 1>>(grid_for(static_cast<std::size_t>(elems), block_threads),
                                                      block_threads, 0, stream, device_ptr(dout), device_ptr(dy), b, t,
                                                      n_head, head_dim);
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, float* losses, float* lse,
                           std::int64_t rows, std::int64_t v, cudaStream_t stream) {
  launch_cross_entropy<T>("cross_entropy", logits, v, targets, losses, lse, nullptr, 1.f, {}, rows, v, stream);
}

template <class T>
void cross_entropy_rows_forward(const T* logits, std::int64_t ld, const std::int32_t* targets, float* losses,
                                float* lse, std::int64_t rows, std::int64_t v, cudaStream_t stream) {
  launch_cross_entropy<T>("cross_entropy", logits, ld, targets, losses, lse, nullptr, 1.f, {}, rows, v, stream);
}

template <class T>
void mean_of_losses(const float* losses, std::int64_t n, T* out, cudaStream_t stream) {
  const char* op = "mean of losses";
  POLYSHARD_CHECK(n >= 1, op, ": no losses to average");
  check_pointer(op, "losses", losses);
  check_pointer(op, "out", out);
  launch<mean_of_floats_kernel<device_t<T>>>(1, 1024, 0, stream, losses, n, device_ptr(out));
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

template <class T>
void cross_entropy_fused(const T* logits, const std::int32_t* targets, float* losses, float* lse,
                         const float* dlosses, float dloss_scale, DeviceGradOut<T> dlogits, std::int64_t rows,
                         std::int64_t v, cudaStream_t stream) {
  launch_cross_entropy<T>("cross_entropy fused", logits, v, targets, losses, lse, dlosses, dloss_scale, dlogits, rows,
                          v, stream);
}

template <class T>
void cross_entropy_rows_fused(const T* logits, std::int64_t ld, const std::int32_t* targets, float* losses,
                              float* lse, float dloss_scale, DeviceGradOut<T> dlogits, std::int64_t rows,
                              std::int64_t v, cudaStream_t stream) {
  launch_cross_entropy<T>("cross_entropy fused", logits, ld, targets, losses, lse, nullptr, dloss_scale, dlogits, rows,
                          v, stream);
}

template <class T>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, const float* lse, const float* dlosses,
                            float dloss_scale, DeviceGradOut<T> dlogits, std::int64_t rows, std::int64_t v,
                            cudaStream_t stream) {
  cross_entropy_rows_backward<T>(logits, v, targets, lse, dlosses, dloss_scale, nullptr, dlogits, rows, v, stream);
}

template <class T>
void cross_entropy_rows_backward(const T* logits, std::int64_t ld, const std::int32_t* targets, const float* lse,
                                 const float* dlosses, float dloss_scale, const T* dloss, DeviceGradOut<T> dlogits,
                                 std::int64_t rows, std::int64_t v, cudaStream_t stream) {
  using D = device_t<T>;
  const char* op = "cross_entropy backward";
  check_rows(op, rows, v, ld);
  if (rows == 0 || !dlogits.wanted()) return;
  check_pointer(op, "lse", lse);
  const unsigned grid = grid_for(static_cast<std::size_t>(rows), 1);
  if (dlogits.accumulate)
    launch<cross_entropy_backward_kernel<D, true>>(grid, row_threads(v), 0, stream, device_ptr(logits), ld, targets,
                                                   lse, dlosses, dloss_scale, device_ptr(dloss),
                                                   device_ptr(dlogits.data), rows, int(v));
  else
    launch<cross_entropy_backward_kernel<D, false>>(grid, row_threads(v), 0, stream, device_ptr(logits), ld, targets,
                                                    lse, dlosses, dloss_scale, device_ptr(dloss),
                                                    device_ptr(dlogits.data), rows, int(v));
  POLYSHARD_CUDA_CHECK_LAUNCH(op);
}

std::size_t column_sum_workspace_floats(std::int64_t rows, std::int64_t cols) {
  check_rows("column_sum", rows, cols);
  return static_cast<std::size_t>(chunk_count(rows) * cols);
}

template <class T>
void column_sum(const T* x, DeviceGradOut<T> out, std::int64_t rows, std::int64_t cols, float* workspace,
                std::size_t workspace_floats, cudaStream_t stream) {
  using D = device_t<T>;
  check_rows("column_sum", rows, cols);
  if (!out.wanted()) return;
  launch_column_sums("column_sum", ColumnTerms<D>{device_ptr(x)}, rows, cols, workspace, workspace_floats,
                     device_ptr(out.data), out.accumulate, static_cast<D*>(nullptr), false, stream);
}

// ---- instantiations -------------------------------------------------------------------------

#define POLYSHARD_TRANSFORMER_KERNELS(T)                                                                              \
  template void embedding_forward<T>(const std::int32_t*, const T*, T*, std::int64_t, std::int64_t, std::int64_t,     \
                                     cudaStream_t);                                                                   \
  template void embedding_backward<T>(const std::int32_t*, const T*, DeviceGradOut<T>, std::int64_t, std::int64_t,    \
                                      std::int64_t, void*, std::size_t, cudaStream_t);                                \
  template void layer_norm_forward<T>(const T*, const T*, const T*, float, T*, float*, float*, std::int64_t,          \
                                      std::int64_t, cudaStream_t);                                                    \
  template void layer_norm_backward<T>(const T*, const T*, const float*, const float*, const T*, DeviceGradOut<T>,    \
                                       DeviceGradOut<T>, DeviceGradOut<T>, std::int64_t, std::int64_t, float*,        \
                                       std::size_t, cudaStream_t);                                                    \
  template void rms_norm_forward<T>(const T*, const T*, float, T*, float*, std::int64_t, std::int64_t, cudaStream_t);  \
  template void rms_norm_backward<T>(const T*, const T*, const float*, const T*, DeviceGradOut<T>, DeviceGradOut<T>,   \
                                     std::int64_t, std::int64_t, float*, std::size_t, cudaStream_t);                   \
  template void grouped_qkv_forward<T>(const T*, const T*, const T*, T*, std::int64_t, std::int64_t, std::int64_t,  \
                                       std::int64_t, cudaStream_t);                                                   \
  template void grouped_qkv_backward<T>(const T*, DeviceGradOut<T>, DeviceGradOut<T>, DeviceGradOut<T>, std::int64_t, \
                                        std::int64_t, std::int64_t, std::int64_t, cudaStream_t);                      \
  template void rope_rotate<T>(const T*, DeviceGradOut<T>, std::int64_t, std::int64_t, std::int64_t, std::int64_t,    \
                               double, std::int64_t, bool, cudaStream_t);                                             \
  template void silu_forward<T>(const T*, T*, std::int64_t, cudaStream_t);                                            \
  template void silu_backward<T>(const T*, const T*, DeviceGradOut<T>, std::int64_t, cudaStream_t);                   \
  template void gelu_forward<T>(const T*, T*, std::int64_t, cudaStream_t);                                            \
  template void gelu_backward<T>(const T*, const T*, DeviceGradOut<T>, std::int64_t, cudaStream_t);                   \
  template void add_into<T>(const T*, const T*, T*, std::int64_t, cudaStream_t);                                      \
  template void add_into_accumulate<T>(const T*, T*, std::int64_t, cudaStream_t);                                     \
  template void scale_into<T>(const T*, double, T*, std::int64_t, cudaStream_t);                                      \
  template void mul_into<T>(const T*, const T*, T*, std::int64_t, cudaStream_t);                                      \
  template void scale_by_device_scalar<T>(const T*, const T*, float, DeviceGradOut<T>, std::int64_t, cudaStream_t);   \
  template void add_scaled_into<T>(const T*, double, T*, std::int64_t, cudaStream_t);                                 \
  template void add_bias_rows<T>(T*, const T*, std::int64_t, std::int64_t, cudaStream_t);                             \
  template void sum<T>(const T*, std::int64_t, double*, double*, cudaStream_t);                                       \
  template void softmax_forward<T>(const T*, T*, std::int64_t, std::int64_t, cudaStream_t);                           \
  template void softmax_backward<T>(const T*, const T*, DeviceGradOut<T>, std::int64_t, std::int64_t, cudaStream_t);  \
  template void causal_softmax_forward<T>(const T*, float, T*, std::int64_t, std::int64_t, cudaStream_t);             \
  template void causal_softmax_backward<T>(const T*, const T*, float, DeviceGradOut<T>, std::int64_t, std::int64_t,   \
                                           cudaStream_t);                                                             \
  template void attention_permute_forward<T>(const T*, T*, T*, T*, std::int64_t, std::int64_t, std::int64_t,          \
                                             std::int64_t, cudaStream_t);                                             \
  template void attention_permute_backward<T>(const T*, const T*, const T*, DeviceGradOut<T>, std::int64_t,           \
                                              std::int64_t, std::int64_t, std::int64_t, cudaStream_t);                \
  template void attention_unpermute_forward<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,  \
                                               cudaStream_t);                                                         \
  template void attention_unpermute_backward<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, \
                                                cudaStream_t);                                                        \
  template void cross_entropy_forward<T>(const T*, const std::int32_t*, float*, float*, std::int64_t, std::int64_t,   \
                                         cudaStream_t);                                                               \
  template void cross_entropy_backward<T>(const T*, const std::int32_t*, const float*, const float*, float,           \
                                          DeviceGradOut<T>, std::int64_t, std::int64_t, cudaStream_t);                \
  template void cross_entropy_fused<T>(const T*, const std::int32_t*, float*, float*, const float*, float,            \
                                       DeviceGradOut<T>, std::int64_t, std::int64_t, cudaStream_t);                   \
  template void cross_entropy_rows_fused<T>(const T*, std::int64_t, const std::int32_t*, float*, float*, float,      \
                                            DeviceGradOut<T>, std::int64_t, std::int64_t, cudaStream_t);              \
  template void cross_entropy_rows_forward<T>(const T*, std::int64_t, const std::int32_t*, float*, float*,          \
                                              std::int64_t, std::int64_t, cudaStream_t);                              \
  template void cross_entropy_rows_backward<T>(const T*, std::int64_t, const std::int32_t*, const float*,             \
                                               const float*, float, const T*, DeviceGradOut<T>, std::int64_t,         \
                                               std::int64_t, cudaStream_t);                                           \
  template void mean_of_losses<T>(const float*, std::int64_t, T*, cudaStream_t);                                      \
  template void column_sum<T>(const T*, DeviceGradOut<T>, std::int64_t, std::int64_t, float*, std::size_t,            \
                              cudaStream_t);

POLYSHARD_TRANSFORMER_KERNELS(float)
POLYSHARD_TRANSFORMER_KERNELS(half)
POLYSHARD_TRANSFORMER_KERNELS(bfloat16)
#undef POLYSHARD_TRANSFORMER_KERNELS

}  // namespace polyshard::cuda
