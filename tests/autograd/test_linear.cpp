// linear and matmul gradients against central finite differences.
#include <catch2/catch.hpp>

#include "support/finite_difference.hpp"
#include "polyshard/autograd/ops/linear.hpp"

using namespace polyshard;
using test::gradient_error;
using test::random_tensor;

TEST_CASE("linear: gradients of input, weight and bias", "[autograd]") {
  const auto [rows, in, out] = GENERATE(std::tuple{1, 1, 1}, std::tuple{5, 3, 4}, std::tuple{2, 7, 1});
  CAPTURE(rows, in, out);
  const double err = gradient_error(
      [](const std::vector<Var<double>>& v) { return linear(v[0], v[1], v[2]); },
      {random_tensor({2, rows, in}, 1), random_tensor({out, in}, 2), random_tensor({out}, 3)});
  CHECK(err < 1e-6);
  CHECK(gradient_error([](const std::vector<Var<double>>& v) { return linear(v[0], v[1]); },
                       {random_tensor({rows, in}, 4), random_tensor({out, in}, 5)}) < 1e-6);
}

TEST_CASE("matmul: gradients, shared and batched right operand", "[autograd]") {
  CHECK(gradient_error([](const std::vector<Var<double>>& v) { return matmul(v[0], v[1]); },
                       {random_tensor({3, 4, 5}, 1), random_tensor({5, 2}, 2)}) < 1e-6);
  CHECK(gradient_error([](const std::vector<Var<double>>& v) { return matmul(v[0], v[1]); },
                       {random_tensor({3, 4, 5}, 3), random_tensor({3, 5, 2}, 4)}) < 1e-6);
}

TEST_CASE("linear rejects a weight that does not fit, naming both shapes", "[autograd]") {
  Var<float> x(Tensor<float>::zeros({2, 3}), true), w(Tensor<float>::zeros({4, 5}), true);
  CHECK_THROWS_WITH(linear(x, w), Catch::Contains("linear") && Catch::Contains("(2, 3)") && Catch::Contains("(4, 5)"));
}
