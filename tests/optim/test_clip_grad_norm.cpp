// Clipping's pieces over host spans: the squared norm against a sum in long double, the same on
// any number of threads; scaling elementwise, the same bits on any number of threads; and
// clip_grad_norm against torch.nn.utils.clip_grad_norm_'s formula on a worked example.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "optim/reference.hpp"
#include "polyshard/optim/optim.hpp"

using namespace polyshard;

namespace {

struct ThreadsGuard {
  ~ThreadsGuard() { set_optimizer_threads(0); }
};

template <class G>
long double exact_squares(const std::vector<G>& g) {
  long double s = 0;
  for (const G& x : g) {
    const long double v = static_cast<compute_t<G>>(x);
    s += v * v;
  }
  return s;
}

// Runs `body` on every instruction set this machine runs, at 1 and 2 threads (both named in the
// messages of its checks), then restores the detected instruction set.
template <class Body>
void on_every_isa_and_thread_count(Body&& body) {
  for (CpuIsa isa : {CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (isa > detected_cpu_isa()) continue;
    set_optimizer_isa(isa);
    for (unsigned threads : {1u, 2u}) {
      set_optimizer_threads(threads);
      INFO(cpu_isa_name(isa) << ", " << threads << " threads");
      body();
    }
  }
  set_optimizer_isa(detected_cpu_isa());
}

}  // namespace

TEMPLATE_TEST_CASE("squared_norm is the sum of squares, the same bits whatever the length, the threads and the "
                   "instruction set", "[optim][clip]", float, bfloat16, half, double) {
  using G = TestType;
  ThreadsGuard guard;
  // Empty, shorter than the lanes, one group of lanes, lanes and a tail, one block and a tail,
  // and long enough for two threads.
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 5, 32, 63, 8193, 3 * (std::size_t{1} << 18) + 77);
  INFO("n = " << n);
  const auto g = test::values_as<G>(n, 17 + n, 3.0);
  set_optimizer_isa(CpuIsa::Portable);
  set_optimizer_threads(1);
  const double portable = squared_norm(std::span<const G>(g));
  const long double want = exact_squares(g);
  CHECK(std::abs(static_cast<long double>(portable) - want) <= 1e-12L * want);
  on_every_isa_and_thread_count([&] {
    CHECK(std::bit_cast<std::uint64_t>(squared_norm(std::span<const G>(g))) == std::bit_cast<std::uint64_t>(portable));
  });
}

TEMPLATE_TEST_CASE("scale_span scales each element in its compute type, the same bits on any threads and "
                   "instruction set", "[optim][clip]", float, bfloat16, half) {
  using G = TestType;
  ThreadsGuard guard;
  const std::size_t n = 3 * (std::size_t{1} << 18) + 5;
  const auto original = test::values_as<G>(n, 5, 3.0);
  std::vector<G> expected(n);
  for (std::size_t i = 0; i < n; ++i) expected[i] = static_cast<G>(static_cast<float>(original[i]) * 0.3f);
  on_every_isa_and_thread_count([&] {
    auto scaled = original;
    scale_span(std::span<G>(scaled), 0.3);
    CHECK(test::same_bits<G>(scaled, expected));
  });
}

TEST_CASE("clip_grad_norm: torch's coefficient max_norm / (norm + 1e-6), applied only below 1", "[optim][clip]") {
  std::vector<float> g{3, 4};  // norm 5
  CHECK(clip_grad_norm(std::span<float>(g), 1.0) == 5.0);
  const auto c = static_cast<float>(1.0 / (5.0 + 1e-6));
  CHECK(g[0] == 3 * c);
  CHECK(g[1] == 4 * c);
  std::vector<float> small{0.3f, 0.4f};  // norm 0.5 < 1: unchanged
  CHECK(clip_grad_norm(std::span<float>(small), 1.0) == Approx(0.5).epsilon(1e-7));
  CHECK(small == std::vector<float>{0.3f, 0.4f});
}
