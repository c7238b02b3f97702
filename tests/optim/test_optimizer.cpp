// The optimizer classes: the Optimizer concept, state ownership and accounting, size checks,
// learning rate, and restoring from a checkpoint.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "optim/reference.hpp"
#include "polyshard/optim/optim.hpp"

using namespace polyshard;
using test::same_bits;

static_assert(Optimizer<Sgd<float>> && Optimizer<Sgd<double>>);
static_assert(Optimizer<Adam<float>> && Optimizer<Adam<double>>);
static_assert(Optimizer<AdamW<float>> && Optimizer<AdamW<double>>);

namespace {
// Everything but a way to restore the step count: not an Optimizer.
struct NoRestore {
  using param_type = float;
  using config_type = SgdConfig;
  void step(std::span<float>, std::span<const float>) {}
  std::int64_t step_count() const { return 0; }
  double lr() const { return 0; }
  void set_lr(double) {}
  std::size_t numel() const { return 0; }
  std::size_t state_bytes() const { return 0; }
  std::vector<std::pair<std::string, Tensor<float>>> state() const { return {}; }
};
static_assert(!Optimizer<NoRestore>);

template <class O>
std::vector<std::string> state_names(const O& o) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : o.state()) names.push_back(name);
  return names;
}
}  // namespace

TEMPLATE_TEST_CASE("the optimizer classes step as their kernels do and count their steps", "[optim][optimizer]",
                   float, double) {
  using P = TestType;
  const std::size_t n = 101;
  const std::vector<P> init = test::cast<P>(test::values(n, 11));
  std::vector<P> by_class = init, by_kernel = init, m(n), v(n), buffer(n);
  Adam<P> adam({.lr = 0.01, .weight_decay = 0.1}, n);
  AdamW<P> adamw({.lr = 0.01}, n);
  Sgd<P> sgd({.lr = 0.1, .momentum = 0.9, .nesterov = true}, n);

  SECTION("Adam") {
    for (std::int64_t s = 1; s <= 3; ++s) {
      const auto g = test::cast<P>(test::values(n, 20 + static_cast<std::uint64_t>(s)));
      adam.step(std::span<P>(by_class), std::span<const P>(g));
      adam_update<P, P>(by_kernel, g, m, v, {.lr = 0.01, .weight_decay = 0.1}, s, false);
    }
    CHECK(adam.step_count() == 3);
    CHECK(state_names(adam) == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
    CHECK(same_bits<P>(adam.state()[0].second.span(), m));
    CHECK(same_bits<P>(adam.state()[1].second.span(), v));
  }
  SECTION("AdamW, with its default weight decay of 1e-2") {
    CHECK(adamw.config().weight_decay == 1e-2);
    for (std::int64_t s = 1; s <= 3; ++s) {
      const auto g = test::cast<P>(test::values(n, 20 + static_cast<std::uint64_t>(s)));
      adamw.step(std::span<P>(by_class), std::span<const P>(g));
      adam_update<P, P>(by_kernel, g, m, v, {.lr = 0.01, .weight_decay = 1e-2}, s, true);
    }
    CHECK(adamw.step_count() == 3);
    CHECK(same_bits<P>(adamw.state()[0].second.span(), m));
  }
  SECTION("SGD") {
    for (std::int64_t s = 1; s <= 3; ++s) {
      const auto g = test::cast<P>(test::values(n, 20 + static_cast<std::uint64_t>(s)));
      sgd.step(std::span<P>(by_class), std::span<const P>(g));
      sgd_update<P, P>(by_kernel, g, buffer, {.lr = 0.1, .momentum = 0.9, .nesterov = true}, s);
    }
    CHECK(sgd.step_count() == 3);
    CHECK(state_names(sgd) == std::vector<std::string>{"momentum_buffer"});
    CHECK(same_bits<P>(sgd.state()[0].second.span(), buffer));
  }
  CHECK(same_bits<P>(by_class, by_kernel));
  CHECK_FALSE(same_bits<P>(by_class, init));
}

TEST_CASE("AdamWConfig keeps PyTorch's weight decay default under designated initializers", "[optim][optimizer]") {
  CHECK(AdamWConfig{}.weight_decay == 1e-2);
  CHECK(AdamWConfig{.lr = 3e-4}.weight_decay == 1e-2);
  CHECK(AdamConfig{}.weight_decay == 0);
  const AdamConfig as_adam = AdamWConfig{.lr = 3e-4, .beta2 = 0.95};
  CHECK(as_adam.lr == 3e-4);
  CHECK(as_adam.beta2 == 0.95);
  CHECK(as_adam.weight_decay == 1e-2);
}

TEMPLATE_TEST_CASE("optimizer state is counted as optimizer state, and only what is kept", "[optim][optimizer]",
                   float, double) {
  using P = TestType;
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  const std::size_t n = 1000;
  const auto counted = [&] { return static_cast<std::size_t>(tracker.current(MemoryCategory::OptimizerState)); };
  {
    Adam<P> adam({}, n);
    CHECK(adam.state_bytes() == 2 * n * sizeof(P));
    CHECK(counted() == adam.state_bytes());
    AdamW<P> adamw({}, n);
    CHECK(counted() == 4 * n * sizeof(P));
    Sgd<P> with_momentum({.momentum = 0.9}, n);
    CHECK(with_momentum.state_bytes() == n * sizeof(P));
    Sgd<P> plain({}, n);
    CHECK(plain.state_bytes() == 0);
    CHECK(plain.state().empty());
    CHECK(counted() == 5 * n * sizeof(P));
  }
  CHECK(counted() == 0);
}

TEST_CASE("step() names the optimizer and both sizes when they differ", "[optim][optimizer]") {
  using Catch::Matchers::Contains;
  std::vector<float> params(10), grads(9), right(10);
  Adam<float> adam({}, 10);
  AdamW<float> adamw({}, 10);
  Sgd<float> sgd({}, 10);
  CHECK_THROWS_WITH(adam.step(std::span<float>(params), std::span<const float>(grads)),
                    Contains("Adam::step") && Contains("10") && Contains("9"));
  CHECK_THROWS_WITH(adamw.step(std::span<float>(params), std::span<const float>(grads)),
                    Contains("AdamW::step") && Contains("grads of 9"));
  std::vector<float> long_params(12);
  CHECK_THROWS_WITH(sgd.step(std::span<float>(long_params), std::span<const float>(right)),
                    Contains("Sgd::step") && Contains("built for 10") && Contains("params of 12"));
  CHECK(adam.step_count() == 0);  // a rejected step is not counted
}

TEST_CASE("constructors reject the options PyTorch rejects", "[optim][optimizer]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(Sgd<float>({.nesterov = true}, 4), Contains("Sgd") && Contains("Nesterov"));
  CHECK_THROWS_WITH(Adam<float>({.beta1 = 1.0}, 4), Contains("Adam") && Contains("beta1"));
  CHECK_THROWS_WITH(AdamW<float>({.beta2 = -0.1}, 4), Contains("AdamW") && Contains("beta2"));
  CHECK_THROWS_WITH(AdamW<float>({.eps = -1}, 4), Contains("epsilon"));
  CHECK_THROWS_AS(Sgd<float>({.lr = -0.1}, 4), Error);
}

TEST_CASE("set_lr changes the step taken", "[optim][optimizer]") {
  const std::size_t n = 20;
  const auto init = test::cast<float>(test::values(n, 3));
  const auto g = test::cast<float>(test::values(n, 4));
  std::vector<float> a = init, b = init;
  AdamW<float> frozen({.lr = 0.1, .weight_decay = 0.1}, n);
  frozen.set_lr(0);
  CHECK(frozen.lr() == 0);
  frozen.step(std::span<float>(a), std::span<const float>(g));
  CHECK(same_bits<float>(a, init));  // lr 0: neither the step nor the decoupled decay moves weights
  Sgd<float> sgd({.lr = 0.1}, n);
  sgd.set_lr(0.2);
  sgd.step(std::span<float>(b), std::span<const float>(g));
  for (std::size_t i = 0; i < n; ++i) CHECK(b[i] == init[i] - 0.2f * g[i]);
  CHECK_THROWS_AS(sgd.set_lr(-1), Error);
}

TEMPLATE_TEST_CASE("state tensors and the step count restore an optimizer mid-run", "[optim][optimizer]", float,
                   double) {
  using P = TestType;
  const std::size_t n = 50;
  const auto grad = [&](std::uint64_t s) { return test::cast<P>(test::values(n, 40 + s)); };
  std::vector<P> original = test::cast<P>(test::values(n, 5));
  AdamW<P> first({.lr = 0.01, .weight_decay = 0.1}, n);
  for (std::uint64_t s = 1; s <= 3; ++s) first.step(std::span<P>(original), std::span<const P>(grad(s)));

  // A checkpoint: parameters, the named state tensors, the step count.
  std::vector<P> restored = original, not_counted = original;
  AdamW<P> second({.lr = 0.01, .weight_decay = 0.1}, n), forgetful({.lr = 0.01, .weight_decay = 0.1}, n);
  const auto saved = first.state();
  const auto into = second.state();
  const auto into_forgetful = forgetful.state();
  REQUIRE(saved.size() == 2);
  for (std::size_t k = 0; k < saved.size(); ++k) {
    CHECK(into[k].first == saved[k].first);
    into[k].second.copy_from(saved[k].second.clone());
    into_forgetful[k].second.copy_from(saved[k].second.clone());
  }
  second.set_step_count(first.step_count());
  for (std::uint64_t s = 4; s <= 5; ++s) {
    first.step(std::span<P>(original), std::span<const P>(grad(s)));
    second.step(std::span<P>(restored), std::span<const P>(grad(s)));
    forgetful.step(std::span<P>(not_counted), std::span<const P>(grad(s)));
  }
  CHECK(second.step_count() == 5);
  CHECK(same_bits<P>(original, restored));
  // Without the step count the bias correction restarts, and the run diverges.
  CHECK_FALSE(same_bits<P>(original, not_counted));
}

TEST_CASE("step() takes gradients in a mutable span and of 16-bit types", "[optim][optimizer]") {
  const std::size_t n = 33;
  auto params = Tensor<float>::from(Shape{static_cast<std::int64_t>(n)}, std::span<const float>(test::cast<float>(test::values(n, 8))));
  auto grads = Tensor<float>::from(Shape{static_cast<std::int64_t>(n)}, std::span<const float>(test::cast<float>(test::values(n, 9))));
  std::vector<bfloat16> grads16(n);
  for (std::size_t i = 0; i < n; ++i) grads16[i] = static_cast<bfloat16>(grads.data()[i]);
  std::vector<float> params16 = params.to_vector();
  Adam<float> a({}, n), b({}, n);
  a.step(params.span(), grads.span());  // std::span<float>, not std::span<const float>
  b.step(std::span<float>(params16), std::span<bfloat16>(grads16));
  CHECK(a.step_count() == 1);
  CHECK(b.step_count() == 1);
  // One Adam step moves each weight by about lr, whatever the gradient's precision.
  const auto before = test::cast<float>(test::values(n, 8));
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(std::abs(params.data()[i] - before[i]) == Approx(1e-3).epsilon(1e-3));
    CHECK(std::abs(params16[i] - before[i]) == Approx(1e-3).epsilon(1e-3));
  }
}

TEMPLATE_TEST_CASE("16-bit master weights and state (PureBf16): each step computed in float and rounded once",
                   "[optim]", bfloat16, half) {
  using P = TestType;
  const double u = std::is_same_v<P, bfloat16> ? 0x1p-8 : 0x1p-11;  // the format's unit roundoff
  const std::size_t n = 40'000;  // more than one chunk of the float kernel
  const std::vector<double> start = test::values(n, 3), grad = test::values(n, 4, 0.5);
  std::vector<P> param = test::cast<P>(start), g = test::cast<P>(grad);
  // The reference starts from the 16-bit values the optimizer sees.
  const std::vector<double> start16(param.begin(), param.end()), grad16(g.begin(), g.end());
  const auto within_one_rounding = [&](std::span<const P> got, const std::vector<double>& want) {
    double worst = 0;  // in units of the rounding allowed
    for (std::size_t i = 0; i < n; ++i)
      worst = std::max(worst, std::abs(double(float(got[i])) - want[i]) / (u * std::abs(want[i]) + 1e-6));
    return worst;
  };
  SECTION("SGD with momentum") {
    const SgdConfig c{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
    std::vector<P> buffer(n);
    test::ReferenceSgd ref{c, start16, {}};
    sgd_update<P, P>(param, g, buffer, c, 1);
    ref.step(grad16);
    CHECK(within_one_rounding(param, ref.p) <= 1.0);
    CHECK(within_one_rounding(buffer, ref.b) <= 1.0);
  }
  SECTION("AdamW") {
    const AdamConfig c{.lr = 0.1, .weight_decay = 0.01};
    std::vector<P> m(n, P(0.0f)), v(n, P(0.0f));
    test::ReferenceAdam ref{c, true, start16, {}, {}};
    adam_update<P, P>(param, g, m, v, c, 1, true);
    ref.step(grad16);
    CHECK(within_one_rounding(param, ref.p) <= 1.0);
    CHECK(within_one_rounding(m, ref.m) <= 1.0);
  }
  // And the update did move the weights by more than a rounding.
  CHECK(within_one_rounding(param, start16) > 10.0);
}
