// The GPT end to end: gradients against finite differences, shapes, a few steps of learning.
#include <catch2/catch.hpp>

#include "support/finite_difference.hpp"
#include "polyshard/nn/nn.hpp"

using namespace polyshard;

using test::random_ids;

TEST_CASE("GPT loss gradient matches finite differences for every parameter", "[nn]") {
  GptConfig cfg{.vocab_size = 7, .block_size = 6, .n_layer = 2, .n_head = 2, .n_embd = 4};
  Gpt<double> model(cfg);
  FlatParameters<double> flat(model);
  flat.initialize(3);
  // Larger weights than GPT-2's 0.02 so that every path carries a visible gradient.
  for (double& x : flat.values().span()) x *= 10;
  const auto x = random_ids({2, 5}, 7, 1), y = random_ids({2, 5}, 7, 2);

  flat.zero_grad();
  backward(model.loss(x, y));
  flat.settle_grads();
  const auto analytic = flat.grads().to_vector();

  const double h = 1e-5;
  double diff2 = 0, norm2 = 0;
  double* p = flat.values().data();
  NoGradGuard no_grad;
  for (std::int64_t i = 0; i < flat.numel(); ++i) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = model.loss(x, y).value().data()[0];
    p[i] = saved - h;
    const double down = model.loss(x, y).value().data()[0];
    p[i] = saved;
    const double numeric = (up - down) / (2 * h);
    diff2 += (numeric - analytic[i]) * (numeric - analytic[i]);
    norm2 += numeric * numeric;
  }
  CHECK(std::sqrt(diff2 / norm2) < 1e-6);
}

TEST_CASE("GPT shapes and input errors", "[nn]") {
  GptConfig cfg{.vocab_size = 9, .block_size = 4, .n_layer = 1, .n_head = 1, .n_embd = 4};
  Gpt<float> model(cfg);
  FlatParameters<float> flat(model);
  flat.initialize(1);
  CHECK(model.logits(random_ids({3, 4}, 9, 1)).shape() == Shape{3, 4, 9});
  CHECK_THROWS_WITH(model.logits(random_ids({1, 5}, 9, 1)), Catch::Contains("longer than the model's 4 positions"));
  CHECK_THROWS_WITH(model.logits(random_ids({5}, 9, 1)), Catch::Contains("(B, T)"));
}

TEST_CASE("a training step in its steady state makes no system allocation", "[nn]") {
  GptConfig cfg{.vocab_size = 32, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 16};
  Gpt<float> model(cfg);
  FlatParameters<float> flat(model);
  flat.initialize(1);
  const auto x = random_ids({4, 16}, 32, 1), y = random_ids({4, 16}, 32, 2);
  auto step = [&] {
    flat.zero_grad();
    backward(model.loss(x, y));
    flat.settle_grads();
    for (std::int64_t i = 0; i < flat.numel(); ++i) flat.values().data()[i] -= 1e-3f * flat.grads().data()[i];
  };
  step();
  step();
  const auto before = CachingHostAllocator::instance().system_allocations();
  for (int i = 0; i < 3; ++i) step();
  CHECK(CachingHostAllocator::instance().system_allocations() == before);
}
