// Gradients of the elementwise, reduction and reshape ops against central finite differences.
#include <catch2/catch.hpp>

#include "support/finite_difference.hpp"
#include "polyshard/autograd/ops.hpp"

using namespace polyshard;
using test::gradient_error;
using test::random_tensor;
using Vars = std::vector<Var<double>>;

namespace {
Shape any_shape() { return GENERATE(Shape{1}, Shape{1, 1}, Shape{3, 4}, Shape{2, 1, 5}, Shape{4, 3, 2}); }
}  // namespace

TEST_CASE("add, operator+, mul and scale: gradients", "[autograd][ops]") {
  const Shape s = any_shape();
  CAPTURE(s);
  const std::vector<Tensor<double>> in{random_tensor(s, 1), random_tensor(s, 2)};
  CHECK(gradient_error([](const Vars& v) { return add(v[0], v[1]); }, in) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return v[0] + v[1]; }, in) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return mul(v[0], v[1]); }, in) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return scale(v[0], -2.5); }, {in[0]}) < 1e-6);
  // An input used twice: the second contribution takes each op's accumulating path.
  CHECK(gradient_error([](const Vars& v) { return mul(v[0], v[0]); }, {in[0]}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return add(scale(v[0], 3.0), scale(v[0], 0.5)); }, {in[0]}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return add(mul(v[0], v[1]), mul(v[1], v[0])); }, in) < 1e-6);
}

TEST_CASE("sum, mean and reshape: gradients and values", "[autograd][ops]") {
  const Shape s = any_shape();
  CAPTURE(s);
  const auto x = random_tensor(s, 3);
  CHECK(gradient_error([](const Vars& v) { return sum(v[0]); }, {x}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return mean(v[0]); }, {x}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return reshape(v[0], Shape{-1}); }, {x}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return mean(add(sum(v[0]), sum(v[0]))); }, {x}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return add(reshape(mul(v[0], v[0]), Shape{1, -1}), reshape(v[0], Shape{1, -1})); },
                       {x}) < 1e-6);
  double total = 0;
  for (double e : x.to_vector()) total += e;
  const Var<double> xv(x);
  CHECK(sum(xv).shape() == Shape{});
  CHECK(sum(xv).value().data()[0] == Approx(total));
  CHECK(mean(xv).value().data()[0] == Approx(total / double(x.numel())));
  CHECK(reshape(xv, Shape{-1}).value().data() == x.data());  // a view, not a copy
}

TEST_CASE("elementwise autograd ops name the op and both shapes on a mismatch", "[autograd][ops]") {
  Var<float> a(Tensor<float>::zeros({2, 3}), true), b(Tensor<float>::zeros({2, 4}), true);
  CHECK_THROWS_WITH(add(a, b), Catch::Contains("add") && Catch::Contains("(2, 3)") && Catch::Contains("(2, 4)"));
  CHECK_THROWS_WITH(a + b, Catch::Contains("add") && Catch::Contains("(2, 3)") && Catch::Contains("(2, 4)"));
  CHECK_THROWS_WITH(mul(a, b), Catch::Contains("mul") && Catch::Contains("(2, 3)") && Catch::Contains("(2, 4)"));
  CHECK_THROWS_WITH(reshape(a, Shape{5}), Catch::Contains("reshape") && Catch::Contains("(2, 3)") && Catch::Contains("(5,)"));
}

TEST_CASE("float elementwise ops give float gradients", "[autograd][ops]") {
  Var<float> a(Tensor<float>::full({4}, 2.f), true), b(Tensor<float>::full({4}, 3.f), true);
  backward(mean(mul(add(a, b), scale(b, 2.0))));
  // d/da mean((a + b) 2b) = 2b / 4, d/db = (2(a + b) + 2b) / 4
  for (float g : a.grad().to_vector()) CHECK(g == Approx(1.5f));
  for (float g : b.grad().to_vector()) CHECK(g == Approx(4.0f));
}
