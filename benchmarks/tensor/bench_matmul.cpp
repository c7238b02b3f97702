// Matrix-product GFLOP/s on transformer shapes, through the tensor layer, against the
// machine's fp32 FMA peak measured in the same run; the BLAS path beside Eigen's own product.
#include <cstdlib>
#include <thread>

#include "polyshard/core/counter_rng.hpp"
#include "polyshard/tensor/ops/matmul.hpp"
#include "support/report.hpp"

using namespace polyshard;

namespace {
Tensor<float> random(const Shape& s, std::uint64_t seed) {
  auto t = Tensor<float>::empty(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = float(counter_normal(seed, std::uint64_t(i)));
  return t;
}

/// Times C = A B (or with B transposed, as linear layers multiply by W^T) through matmul_into.
double gflops(std::int64_t m, std::int64_t n, std::int64_t k, bool transposed_b, int repeats) {
  auto a = random({m, k}, 1);
  auto b = transposed_b ? random({n, k}, 2).transpose() : random({k, n}, 2);
  auto c = Tensor<float>::empty({m, n});
  const double s = bench::median_seconds([&] { matmul_into(a, b, c); }, repeats);
  return 2.0 * double(m) * double(n) * double(k) / s / 1e9;
}

/// Eigen's own product on the same shapes, for comparison with the BLAS the tensor layer uses.
double eigen_gflops(std::int64_t m, std::int64_t n, std::int64_t k, int repeats) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Mat a = Mat::Random(m, k), b = Mat::Random(k, n), c(m, n);
  const double s = bench::median_seconds([&] { c.noalias() = a * b; }, repeats);
  return 2.0 * double(m) * double(n) * double(k) / s / 1e9;
}
}  // namespace

int main(int argc, char** argv) {
  const auto args = bench::parse_args(argc, argv, "bench_matmul.json");
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  cpu::set_blas_threads(threads);
  Eigen::setNbThreads(threads);
  const double peak = bench::measure_fma_peak_gflops(threads);
  std::printf("fp32 FMA peak (%s), %d threads: %.1f GFLOP/s; BLAS: %s\n", bench::fma_peak_instructions(), threads, peak,
              cpu::blas().name.c_str());

  struct Case {
    std::int64_t m, n, k;
    bool transposed_b;
    const char* what;
  };
  const std::int64_t rows = args.quick ? 2048 : 8192;
  const Case cases[] = {{rows, 768, 768, true, "attn.c_proj forward"},
                        {rows, 3072, 768, true, "mlp.c_fc forward"},
                        {rows, 768, 3072, true, "mlp.c_proj forward"},
                        {rows, 2304, 768, true, "attn.c_attn forward"},
                        {rows, 768, 768, false, "input gradient"}};
  bench::Table table("matmul (fp32) against the FMA peak");
  const int repeats = args.quick ? 3 : 7;
  for (const Case& c : cases) {
    const double g = gflops(c.m, c.n, c.k, c.transposed_b, repeats);
    const double e = eigen_gflops(c.m, c.n, c.k, repeats);
    table.row()
        .set("shape MxNxK", std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k))
        .set("use", c.what)
        .set("polyshard GFLOP/s", g)
        .set("% of peak", 100.0 * g / peak)
        .set("Eigen GFLOP/s", e)
        .set("Eigen % of peak", 100.0 * e / peak)
        .set("peak GFLOP/s", peak);
  }
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
