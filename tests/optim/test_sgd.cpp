// SGD against its formula in double precision, step by step, for every option.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "optim/reference.hpp"
#include "polyshard/optim/sgd.hpp"

using namespace polyshard;
using test::max_abs_diff;

namespace {
struct SgdCase {
  std::string name;
  SgdConfig config;
};
}  // namespace

TEMPLATE_TEST_CASE("sgd_update follows the SGD formula step by step", "[optim][sgd]", float, double) {
  using P = TestType;
  const auto c = GENERATE(values<SgdCase>({
      {"plain", {.lr = 0.1}},
      {"weight decay", {.lr = 0.1, .weight_decay = 0.05}},
      {"momentum", {.lr = 0.1, .momentum = 0.9}},
      {"momentum, dampening", {.lr = 0.1, .momentum = 0.9, .dampening = 0.5}},
      {"momentum, dampening, weight decay", {.lr = 0.1, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.05}},
      {"nesterov", {.lr = 0.1, .momentum = 0.9, .nesterov = true}},
      {"nesterov, weight decay", {.lr = 0.05, .momentum = 0.7, .weight_decay = 0.1, .nesterov = true}},
  }));
  INFO("config: " << c.name);
  const std::size_t n = 37;  // not a multiple of any packet size: the padded tail runs too
  std::vector<P> param = test::cast<P>(test::values(n, 1));
  std::vector<P> buffer(c.config.momentum != 0 ? n : 0);
  test::ReferenceSgd ref{c.config, {param.begin(), param.end()}, {}};
  test::ReferenceSgd plain{{.lr = c.config.lr}, {param.begin(), param.end()}, {}};
  for (std::int64_t step = 1; step <= 5; ++step) {
    const std::vector<P> grad = test::cast<P>(test::values(n, 100 + static_cast<std::uint64_t>(step)));
    const std::vector<double> grad_d(grad.begin(), grad.end());
    sgd_update<P, P>(param, grad, buffer, c.config, step);
    ref.step(grad_d);
    plain.step(grad_d);
    INFO("step " << step);
    CHECK(max_abs_diff<P>(param, ref.p) <= test::tolerance<P>);
    if (c.config.momentum != 0) CHECK(max_abs_diff<P>(buffer, ref.b) <= test::tolerance<P>);
  }
  // The options must have changed the trajectory, or the comparison above proves nothing about them.
  if (c.name != "plain") CHECK(max_abs_diff<P>(param, plain.p) > 1000 * test::tolerance<P>);
}

TEST_CASE("sgd_update: the first momentum step copies the gradient, undamped", "[optim][sgd]") {
  std::vector<double> param{1.0, -2.0}, grad{0.5, 0.25}, buffer{123.0, 456.0};  // stale buffer: ignored
  sgd_update<double, double>(param, grad, buffer, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5}, 1);
  CHECK(buffer == std::vector<double>{0.5, 0.25});
  CHECK(param == std::vector<double>{1.0 - 0.1 * 0.5, -2.0 - 0.1 * 0.25});
  // Second step: buffer = 0.9 * buffer + (1 - 0.5) * grad.
  sgd_update<double, double>(param, grad, buffer, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5}, 2);
  CHECK(buffer[0] == Approx(0.9 * 0.5 + 0.5 * 0.5).epsilon(1e-15));
  CHECK(buffer[1] == Approx(0.9 * 0.25 + 0.5 * 0.25).epsilon(1e-15));
}

TEST_CASE("sgd_update rejects mismatched sizes and invalid options", "[optim][sgd]") {
  std::vector<float> param(8), grad(7), buffer(8), none;
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH((sgd_update<float, float>(param, grad, none, {}, 1)),
                    Contains("sgd_update") && Contains("param 8") && Contains("grad 7"));
  grad.resize(8);
  CHECK_THROWS_WITH((sgd_update<float, float>(param, grad, none, {.momentum = 0.9}, 1)),
                    Contains("momentum_buffer has 0 elements, expected 8"));
  CHECK_THROWS_WITH((sgd_update<float, float>(param, grad, buffer, {}, 1)),
                    Contains("momentum_buffer has 8 elements, expected 0"));
  CHECK_THROWS_WITH((sgd_update<float, float>(param, grad, none, {}, 0)), Contains("step counts from 1"));
  CHECK_THROWS_WITH((sgd_update<float, float>(param, grad, none, {.nesterov = true}, 1)), Contains("Nesterov"));
  CHECK_THROWS_WITH((sgd_update<float, float>(param, grad, buffer, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}, 1)),
                    Contains("Nesterov"));
  CHECK_THROWS_AS((sgd_update<float, float>(param, grad, none, {.lr = -1}, 1)), Error);
}
