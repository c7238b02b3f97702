// Adam and AdamW against their formulas in double precision, step by step.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "optim/reference.hpp"
#include "polyshard/optim/adam.hpp"

using namespace polyshard;
using test::max_abs_diff;

namespace {
struct AdamCase {
  std::string name;
  AdamConfig config;
  bool decoupled;
};
}  // namespace

TEMPLATE_TEST_CASE("adam_update follows the Adam and AdamW formulas step by step", "[optim][adam]", float, double) {
  using P = TestType;
  const auto c = GENERATE(values<AdamCase>({
      {"Adam", {.lr = 0.1}, false},
      {"Adam, weight decay", {.lr = 0.1, .weight_decay = 0.1}, false},
      {"Adam, large eps", {.lr = 0.1, .eps = 0.1}, false},  // eps inside the root would differ
      {"Adam, beta1 below 0.5", {.lr = 0.1, .beta1 = 0.3, .beta2 = 0.9}, false},  // lerp's upper branch
      {"AdamW", {.lr = 0.1, .weight_decay = 0.0}, true},
      {"AdamW, weight decay", {.lr = 0.1, .weight_decay = 0.2}, true},
      {"AdamW, weight decay, large eps", {.lr = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 0.05, .weight_decay = 0.3}, true},
  }));
  INFO("config: " << c.name);
  const std::size_t n = 37;  // not a multiple of any packet size: the padded tail runs too
  std::vector<P> param = test::cast<P>(test::values(n, 2));
  std::vector<P> m(n), v(n);
  test::ReferenceAdam ref{c.config, c.decoupled, {param.begin(), param.end()}, {}, {}};
  for (std::int64_t step = 1; step <= 6; ++step) {
    const std::vector<P> grad = test::cast<P>(test::values(n, 200 + static_cast<std::uint64_t>(step)));
    adam_update<P, P>(param, grad, m, v, c.config, step, c.decoupled);
    ref.step({grad.begin(), grad.end()});
    INFO("step " << step);
    CHECK(max_abs_diff<P>(param, ref.p) <= test::tolerance<P>);
    CHECK(max_abs_diff<P>(m, ref.m) <= test::tolerance<P>);
    CHECK(max_abs_diff<P>(v, ref.v) <= test::tolerance<P>);
  }
}

TEMPLATE_TEST_CASE("adam_update: the reference's distinctions are visible at the tolerance", "[optim][adam]", float,
                   double) {
  // Guards the test above: each variant a wrong kernel might implement lands far outside it.
  using P = TestType;
  const std::size_t n = 37;
  auto run = [&](const AdamConfig& c, bool decoupled) {
    test::ReferenceAdam r{c, decoupled, test::values(n, 2), {}, {}};
    for (std::uint64_t s = 1; s <= 6; ++s) r.step(test::values(n, 200 + s));
    return r.p;
  };
  const auto far = [&](const std::vector<double>& a, const std::vector<double>& b) {
    return max_abs_diff<double>(a, b) > 1000 * test::tolerance<P>;
  };
  CHECK(far(run({.lr = 0.1, .weight_decay = 0.1}, false), run({.lr = 0.1, .weight_decay = 0.1}, true)));
  CHECK(far(run({.lr = 0.1, .weight_decay = 0.1}, true), run({.lr = 0.1}, true)));
  // eps inside the root: sqrt(v_hat + eps) against sqrt(v_hat) + eps.
  test::ReferenceAdam inside{{.lr = 0.1, .eps = 0.1}, false, test::values(n, 2), std::vector<double>(n),
                             std::vector<double>(n)};
  for (std::uint64_t s = 1; s <= 6; ++s) {
    const auto g = test::values(n, 200 + s);
    for (std::size_t i = 0; i < n; ++i) {
      inside.m[i] = 0.9 * inside.m[i] + 0.1 * g[i];
      inside.v[i] = 0.999 * inside.v[i] + 0.001 * g[i] * g[i];
      const double m_hat = inside.m[i] / (1 - std::pow(0.9, double(s)));
      const double v_hat = inside.v[i] / (1 - std::pow(0.999, double(s)));
      inside.p[i] -= 0.1 * m_hat / std::sqrt(v_hat + 0.1);
    }
  }
  CHECK(far(run({.lr = 0.1, .eps = 0.1}, false), inside.p));
}

TEST_CASE("adam_update: the first step moves each weight by lr * g / (|g| + eps)", "[optim][adam]") {
  // With zero moments the bias corrections cancel exactly: m_hat = g, v_hat = g^2.
  std::vector<double> param{1.0, -1.0, 0.5}, grad{0.3, -2.0, 1e-3}, m(3), v(3);
  const AdamConfig c{.lr = 0.01, .eps = 1e-8};
  adam_update<double, double>(param, grad, m, v, c, 1, false);
  const double expected[] = {1.0 - 0.01 * 0.3 / (0.3 + 1e-8), -1.0 + 0.01 * 2.0 / (2.0 + 1e-8),
                             0.5 - 0.01 * 1e-3 / (1e-3 + 1e-8)};
  for (int i = 0; i < 3; ++i) CHECK(param[i] == Approx(expected[i]).epsilon(1e-14));
  CHECK(m[0] == Approx(0.1 * 0.3).epsilon(1e-15));
  CHECK(v[1] == Approx(0.001 * 4.0).epsilon(1e-15));
}

TEST_CASE("adam_update: AdamW shrinks weights by lr * weight_decay before the step", "[optim][adam]") {
  std::vector<double> param{2.0}, zero_grad{0.0}, m(1), v(1);
  // A zero gradient leaves m = v = 0, so the only change is the decay (eps keeps 0 / eps finite).
  adam_update<double, double>(param, zero_grad, m, v, {.lr = 0.1, .weight_decay = 0.5}, 1, true);
  CHECK(param[0] == Approx(2.0 * (1 - 0.1 * 0.5)).epsilon(1e-15));
  // Adam's coupled decay instead feeds the gradient: a normalized step of about lr.
  std::vector<double> coupled{2.0}, m2(1), v2(1);
  adam_update<double, double>(coupled, zero_grad, m2, v2, {.lr = 0.1, .weight_decay = 0.5}, 1, false);
  CHECK(coupled[0] == Approx(2.0 - 0.1).epsilon(1e-7));
}

TEST_CASE("adam_update rejects mismatched sizes", "[optim][adam]") {
  std::vector<float> param(8), grad(8), m(8), v(7);
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH((adam_update<float, float>(param, grad, m, v, {}, 1, true)),
                    Contains("adamw_update") && Contains("exp_avg_sq 7") && Contains("param 8"));
  v.resize(8);
  CHECK_THROWS_WITH((adam_update<float, float>(param, grad, m, v, {}, 0, false)),
                    Contains("adam_update") && Contains("step counts from 1"));
}
