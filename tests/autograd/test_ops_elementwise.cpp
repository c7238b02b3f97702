// Gradients of the elementwise, reduction and reshape ops against central finite differences.
#include <catch2/catch.hpp>

#include <cmath>
#include <utility>
#include <vector>

#include "support/finite_difference.hpp"
#include "polyshard/autograd/ops.hpp"
#include "polyshard/core/memory_tracker.hpp"

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

TEST_CASE("add over a projection that it alone reads writes the sum in the projection's place, and leaves a "
          "projection held elsewhere as it was",
          "[autograd][ops]") {
  const std::int64_t rows = 6, width = 5;
  const auto x0 = random_tensor({rows, width}, 7), w0 = random_tensor({width, width}, 8), b0 = random_tensor({width}, 9);
  const Var<double> x(x0, true), w(w0, true), b(b0, true);
  // The oracle, by hand: x + x W^T + b.
  std::vector<double> expected(static_cast<std::size_t>(rows * width));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < width; ++j) {
      double v = x0.data()[i * width + j] + b0.data()[j];
      for (std::int64_t k = 0; k < width; ++k) v += x0.data()[i * width + k] * w0.data()[j * width + k];
      expected[static_cast<std::size_t>(i * width + j)] = v;
    }
  const auto close = [&](const Var<double>& y) {
    const auto got = y.value().to_vector();
    for (std::size_t i = 0; i < got.size(); ++i)
      if (std::abs(got[i] - expected[i]) > 1e-12) return false;
    return got.size() == expected.size();
  };
  MemoryTracker tracker;
  TrackerScope counted(tracker);
  const auto kept_by = [&](auto&& run) {  // bytes alive while run's results are held
    const std::int64_t before = tracker.current_total();
    const auto held = run();
    return tracker.current_total() - before;
  };
  const std::int64_t one = rows * width * std::int64_t(sizeof(double));

  // A temporary projection: the sum takes its storage.
  const std::int64_t temporary = kept_by([&] {
    Var<double> y = add(x, linear(x, w, b));
    CHECK(close(y));
    return y;
  });
  // A projection the caller holds (its Var, or only its value's storage): untouched, and the sum
  // is a tensor of its own.
  const std::int64_t held = kept_by([&] {
    Var<double> p = linear(x, w, b);
    const auto before = p.value().to_vector();
    Var<double> y = add(x, p);
    CHECK(close(y));
    CHECK(p.value().to_vector() == before);
    return std::pair{p, y};
  });
  kept_by([&] {
    Var<double> p = linear(x, w, b);
    const Tensor<double> value = p.value();
    const auto before = value.to_vector();
    Var<double> y = add(x, std::move(p));
    CHECK_FALSE(p.defined());  // NOLINT(bugprone-use-after-move): moving gives the handle up
    CHECK(close(y));
    CHECK(value.to_vector() == before);
    return std::pair{value, y};
  });
  CHECK(held - temporary == one);
  // add(v, std::move(v)) still reads v as the first operand.
  Var<double> v = linear(x, w, b);
  const Var<double> twice = add(v, std::move(v));
  for (std::size_t i = 0; i < expected.size(); ++i)
    CHECK(twice.value().to_vector()[i] == Approx(2 * (expected[i] - x0.to_vector()[i])).epsilon(1e-12));
  // Gradients through the sum written in place.
  CHECK(gradient_error([](const Vars& in) { return add(in[0], linear(in[0], in[1], in[2])); }, {x0, w0, b0}) < 1e-6);
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
