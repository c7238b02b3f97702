// bf16 matrix products on GPT-2 small's shapes (8192 tokens, C = 768, 12 heads): TFLOP/s through
// polyshard::cuda::matmul against cuBLASLt called directly on the same shapes (target: >= 95%),
// and the best bf16 rate seen, the measured matrix-product peak that MFU is computed against.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "polyshard/core/cuda/device_buffer.hpp"
#include "polyshard/core/cuda/runtime.hpp"
#include "polyshard/core/cuda/stream.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/tensor/cuda/matmul.hpp"
#include "support/cuda_timing.hpp"
#include "support/report.hpp"

namespace {

using bf16 = polyshard::bfloat16;

/// One row-major product C (m, n) = op(A) op(B), `batch` times over packed strided batches.
struct Case {
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  std::int64_t batch;
  const char* use;

  std::int64_t a_numel() const { return m * k * batch; }
  std::int64_t b_numel() const { return k * n * batch; }
  std::int64_t c_numel() const { return m * n * batch; }
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(batch); }
  std::string shape() const { return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k); }
  std::string op() const { return std::string(trans_a ? "A^T" : "A") + (trans_b ? " B^T" : " B"); }
};

/// cuBLASLt called directly, independently of polyshard's wrapper: its own handle, descriptors
/// and workspace (the same size), and the heuristic's first algorithm, prepared once per shape.
class DirectLt {
 public:
  DirectLt() {
    POLYSHARD_CUBLAS_CHECK(cublasLtCreate(&handle_));
    POLYSHARD_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes));
  }
  ~DirectLt() {
    release();
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }
  DirectLt(const DirectLt&) = delete;
  DirectLt& operator=(const DirectLt&) = delete;

  /// Descriptors for `c`. The row-major product is the column-major C^T = op(B)^T op(A)^T, the
  /// usual way of calling a column-major GEMM from row-major code: B goes first.
  void prepare(const Case& c) {
    release();
    POLYSHARD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_first = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    POLYSHARD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
    POLYSHARD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
    // A row-major (rows, cols) matrix is a column-major (cols, rows) one with ld = cols.
    const std::int64_t b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
    const std::int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
    first_ = layout(b_cols, b_rows, b_cols, c.batch, c.k * c.n);
    second_ = layout(a_cols, a_rows, a_cols, c.batch, c.m * c.k);
    out_ = layout(c.n, c.m, c.n, c.batch, c.m * c.n);

    cublasLtMatmulPreference_t pref = nullptr;
    POLYSHARD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t bytes = workspace_bytes;
    POLYSHARD_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t rc =
        cublasLtMatmulAlgoGetHeuristic(handle_, desc_, first_, second_, out_, out_, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    POLYSHARD_CUBLAS_CHECK(rc);
    if (found == 0) throw polyshard::Error("direct cuBLASLt: no algorithm for " + c.shape());
    algo_ = result.algo;
  }

  void run(const bf16* a, const bf16* b, bf16* c, cudaStream_t stream) const {
    const float alpha = 1.0f, beta = 0.0f;
    POLYSHARD_CUBLAS_CHECK(cublasLtMatmul(handle_, desc_, &alpha, b, first_, a, second_, &beta, c, out_, c, out_,
                                          &algo_, workspace_, workspace_bytes, stream));
  }

  static constexpr std::size_t workspace_bytes = polyshard::cuda::CublasLt::workspace_bytes;

 private:
  static cublasLtMatrixLayout_t layout(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                                       std::int64_t stride) {
    cublasLtMatrixLayout_t l = nullptr;
    POLYSHARD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, std::uint64_t(rows), std::uint64_t(cols), ld));
    if (batch > 1) {
      const std::int32_t count = std::int32_t(batch);
      POLYSHARD_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      POLYSHARD_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
    return l;
  }
  void release() {
    for (auto* l : {first_, second_, out_})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
    first_ = second_ = out_ = nullptr;
    desc_ = nullptr;
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t first_ = nullptr, second_ = nullptr, out_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
};

using bench::median;
using bench::sample_ms;

}  // namespace

int main(int argc, char** argv) {
  const auto args = bench::parse_args(argc, argv, "bench_matmul_cuda.json");
  const auto devices = polyshard::cuda::available_devices();
  if (!devices) {
    std::printf("no CUDA device: %s\n", devices.reason.c_str());
    return 0;
  }
  try {
    std::printf("device: %s\n", polyshard::cuda::device_description(0).c_str());
    const std::int64_t tokens = 8192, bh = 96, t = 1024, hs = 64;
    // Linear layers keep W as (out, in): forward X W^T, input gradient dY W, weight gradient dY^T X.
    const std::vector<Case> cases = {
        {tokens, 2304, 768, false, true, 1, "attn.c_attn forward"},
        {tokens, 768, 768, false, true, 1, "attn.c_proj forward"},
        {tokens, 3072, 768, false, true, 1, "mlp.c_fc forward"},
        {tokens, 768, 3072, false, true, 1, "mlp.c_proj forward"},
        {tokens, 50304, 768, false, true, 1, "lm_head forward"},
        {tokens, 768, 2304, false, false, 1, "attn.c_attn input grad"},
        {tokens, 768, 768, false, false, 1, "attn.c_proj input grad"},
        {tokens, 768, 3072, false, false, 1, "mlp.c_fc input grad"},
        {tokens, 3072, 768, false, false, 1, "mlp.c_proj input grad"},
        {tokens, 768, 50304, false, false, 1, "lm_head input grad"},
        {2304, 768, tokens, true, false, 1, "attn.c_attn weight grad"},
        {768, 768, tokens, true, false, 1, "attn.c_proj weight grad"},
        {3072, 768, tokens, true, false, 1, "mlp.c_fc weight grad"},
        {768, 3072, tokens, true, false, 1, "mlp.c_proj weight grad"},
        {50304, 768, tokens, true, false, 1, "lm_head weight grad"},
        {t, t, hs, false, true, bh, "attention Q K^T, dO V^T"},
        {t, hs, t, false, false, bh, "attention P V, dS K"},
        {t, hs, t, true, false, bh, "attention P^T dO, dS^T Q"},
    };
    const int repeats = args.quick ? 5 : 21;
    polyshard::cuda::Stream stream;

    // One pool of random bf16 values that every case reads A and B from (a tile of random
    // values copied across it: constant data would flatter the tensor cores' power draw).
    std::int64_t pool_numel = 0;
    for (const Case& c : cases) pool_numel = std::max(pool_numel, c.a_numel() + c.b_numel());
    polyshard::cuda::DeviceBuffer<bf16> pool(std::size_t(pool_numel), polyshard::MemoryCategory::Other, stream);
    {
      std::vector<bf16> tile(std::size_t(1) << 22);
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (auto& x : tile) x = bf16(u(rng));
      for (std::int64_t at = 0; at < pool_numel; at += std::int64_t(tile.size())) {
        const std::size_t n = std::size_t(std::min<std::int64_t>(std::int64_t(tile.size()), pool_numel - at));
        POLYSHARD_CUDA_CHECK(
            cudaMemcpyAsync(pool.data() + at, tile.data(), n * sizeof(bf16), cudaMemcpyHostToDevice, stream));
      }
      stream.synchronize();
    }

    struct Result {
      double polyshard_tflops, direct_tflops;
    };
    std::vector<Result> results;
    DirectLt direct;
    for (const Case& c : cases) {
      const bf16* a = pool.data();
      const bf16* b = pool.data() + c.a_numel();
      polyshard::cuda::DeviceBuffer<bf16> out(std::size_t(c.c_numel()), polyshard::MemoryCategory::Other, stream);

      polyshard::cuda::MatmulArgs<bf16> mm;
      mm.m = c.m;
      mm.n = c.n;
      mm.k = c.k;
      mm.a = a;
      mm.trans_a = c.trans_a;
      mm.b = b;
      mm.trans_b = c.trans_b;
      mm.c = out.data();
      mm.batch_count = c.batch;
      mm.stride_a = c.m * c.k;
      mm.stride_b = c.k * c.n;
      mm.stride_c = c.m * c.n;
      const std::function<void()> ours = [&] { polyshard::cuda::matmul(mm, stream); };
      direct.prepare(c);
      const std::function<void()> theirs = [&] { direct.run(a, b, out.data(), stream); };

      // Warm-up (the first call builds polyshard's plan), then enough calls per sample for
      // about a millisecond of work, samples of the two interleaved so that clocks drift alike.
      for (int i = 0; i < 3; ++i) {
        ours();
        theirs();
      }
      const double estimate = std::max(sample_ms(theirs, 1, stream), 1e-3);
      const int inner = std::clamp(int(std::ceil(1.0 / estimate)), 1, 50);
      std::vector<double> ours_ms, theirs_ms;
      for (int r = 0; r < repeats; ++r) {
        ours_ms.push_back(sample_ms(ours, inner, stream));
        theirs_ms.push_back(sample_ms(theirs, inner, stream));
      }
      results.push_back({c.flops() / (median(ours_ms) * 1e-3) / 1e12, c.flops() / (median(theirs_ms) * 1e-3) / 1e12});
      stream.synchronize();
    }

    double peak = 0, worst_ratio = 1e9;
    for (const Result& r : results) {
      peak = std::max({peak, r.polyshard_tflops, r.direct_tflops});
      worst_ratio = std::min(worst_ratio, r.polyshard_tflops / r.direct_tflops);
    }
    bench::Table table("bf16 matmul on GPT-2 small shapes: polyshard::cuda::matmul against cuBLASLt called directly");
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const Result& r = results[i];
      table.row()
          .set("shape MxNxK", c.shape())
          .set("batch", double(c.batch), 0)
          .set("op", c.op())
          .set("use", c.use)
          .set("polyshard TFLOP/s", r.polyshard_tflops)
          .set("cuBLASLt TFLOP/s", r.direct_tflops)
          .set("ratio %", 100.0 * r.polyshard_tflops / r.direct_tflops)
          .set("measured bf16 peak TFLOP/s", peak);
    }
    table.print();
    table.write_json(args.json);
    std::printf("\nmeasured bf16 matrix-product peak: %.1f TFLOP/s\n", peak);
    std::printf("worst polyshard / cuBLASLt ratio: %.1f%% (target >= 95%%): %s\n", 100.0 * worst_ratio,
                worst_ratio >= 0.95 ? "met" : "NOT MET");
    std::printf("JSON: %s\n", args.json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_matmul_cuda: %s\n", e.what());
    return 1;
  }
}
