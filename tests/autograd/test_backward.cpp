// The backward sweep: accumulation, set-to-none, no-grad scopes, graph release.
#include <catch2/catch.hpp>

#include "support/finite_difference.hpp"
#include "polyshard/autograd/ops/linear.hpp"
#include "polyshard/autograd/ops/reduce.hpp"

using namespace polyshard;

TEST_CASE("gradients accumulate across backward calls until zeroed", "[autograd]") {
  Var<double> x(test::random_tensor({3, 4}, 1), true);
  Var<double> w(test::random_tensor({2, 4}, 2), true);
  backward(linear(x, w), Tensor<double>::full({3, 2}, 1.0));
  const auto once = w.grad().to_vector();
  backward(linear(x, w), Tensor<double>::full({3, 2}, 1.0));
  const auto twice = w.grad().to_vector();
  for (std::size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == Approx(2 * once[i]));
  w.zero_grad();
  CHECK_FALSE(w.grad().defined());
  backward(linear(x, w), Tensor<double>::full({3, 2}, 1.0));
  CHECK(w.grad().to_vector() == once);
}

TEST_CASE("a bound gradient buffer receives the leaf's gradient", "[autograd]") {
  auto flat = Tensor<double>::full({10}, 99.0);
  Var<double> w(test::random_tensor({2, 4}, 2), true);
  w.node()->grad = flat.flat_view(1, 8).reshape({2, 4});  // bound, not yet holding a gradient
  Var<double> x(test::random_tensor({3, 4}, 1), false);
  backward(linear(x, w), Tensor<double>::full({3, 2}, 1.0));
  CHECK(w.grad().data() == flat.data() + 1);
  CHECK(flat.data()[0] == 99.0);  // neighbours untouched
  CHECK(flat.data()[9] == 99.0);
  CHECK(flat.data()[1] != 99.0);  // overwritten, not added to the stale value
}

TEST_CASE("no graph is recorded under NoGradGuard", "[autograd]") {
  Var<double> x(test::random_tensor({3, 4}, 1), true);
  Var<double> w(test::random_tensor({2, 4}, 2), true);
  NoGradGuard guard;
  auto y = linear(x, w);
  CHECK_FALSE(y.requires_grad());
  CHECK_THROWS_WITH(backward(y, Tensor<double>::zeros({3, 2})), Catch::Contains("does not require a gradient"));
}

TEST_CASE("an input used twice gets the sum of both contributions", "[autograd]") {
  CHECK(test::gradient_error(
            [](const std::vector<Var<double>>& v) { return matmul(linear(v[0], v[1]), v[1]); },
            {test::random_tensor({3, 4}, 1), test::random_tensor({4, 4}, 2)}) < 1e-6);
}

TEST_CASE("Var::item reads a one-element variable and names the shape of any other", "[autograd]") {
  const Var<double> x(Tensor<double>::full({2, 3}, 1.5), true);
  const Var<double> total = sum(x);
  CHECK(total.item() == 9.0);
  CHECK_THROWS_WITH(x.item(), Catch::Contains("Var::item: a variable of shape (2, 3) has 6 elements, not one"));
  CHECK_THROWS_WITH(Var<float>().item(), Catch::Contains("undefined"));
}
