// The backward sweep: accumulation, set-to-none, no-grad scopes, graph release.
#include <catch2/catch.hpp>

#include "support/finite_difference.hpp"
#include "polyshard/autograd/checkpoint.hpp"
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

namespace {
/// What a GradientReadyScope was told in one sweep: each leaf, and its gradient at that moment.
struct Told {
  std::vector<const Node<double>*> leaves;
  std::vector<std::vector<double>> grads;
};
}  // namespace

TEST_CASE("a sweep tells the ready hook of each leaf once, after its last reader, with its final gradient",
          "[autograd]") {
  Var<double> x(test::random_tensor({3, 4}, 1), false);
  Var<double> w1(test::random_tensor({4, 4}, 2), true), w2(test::random_tensor({4, 4}, 3), true);
  // w1 is read first and last (tied): it is final only when the first reader's backward has run.
  const Var<double> loss = sum(linear(linear(linear(x, w1), w2), w1));
  Told told;
  {
    GradientReadyScope<double, Cpu> scope([&](Node<double>& leaf) {
      told.leaves.push_back(&leaf);
      told.grads.push_back(leaf.grad.to_vector());
    });
    backward(loss);
  }
  REQUIRE(told.leaves.size() == 2);
  CHECK(told.leaves[0] == w2.node().get());
  CHECK(told.leaves[1] == w1.node().get());
  CHECK(told.grads[0] == w2.grad().to_vector());
  CHECK(told.grads[1] == w1.grad().to_vector());
  // Outside the scope, nothing is told.
  w1.zero_grad();
  w2.zero_grad();
  backward(sum(linear(linear(x, w1), w2)));
  CHECK(told.leaves.size() == 2);
}

TEST_CASE("the ready hook waits for a checkpoint's inner sweep, and is not told of the leaves only it reads",
          "[autograd]") {
  Var<double> x(test::random_tensor({3, 4}, 1), false);
  Var<double> w1(test::random_tensor({4, 4}, 2), true), w2(test::random_tensor({4, 4}, 3), true),
      w3(test::random_tensor({4, 4}, 4), true);
  // w3 is final before the checkpoint runs, but the checkpoint's recomputed graph could read it
  // too: it is told once the checkpoint's backward has run. w2 is read inside the checkpoint only.
  const Var<double> h = checkpoint([&](const Var<double>& a) { return linear(a, w2); }, linear(x, w1));
  const Var<double> loss = sum(linear(h, w3));
  Told told;
  std::vector<bool> w2_final_when_told;
  {
    GradientReadyScope<double, Cpu> scope([&](Node<double>& leaf) {
      told.leaves.push_back(&leaf);
      told.grads.push_back(leaf.grad.to_vector());
      w2_final_when_told.push_back(w2.grad().defined());
    });
    backward(loss);
  }
  REQUIRE(told.leaves.size() == 2);
  CHECK(told.leaves[0] == w3.node().get());
  CHECK(w2_final_when_told[0]);  // the checkpoint had run
  CHECK(told.leaves[1] == w1.node().get());
  CHECK(told.grads[0] == w3.grad().to_vector());
  CHECK(told.grads[1] == w1.grad().to_vector());
}
