// Activation checkpointing gives the gradients of the plain graph, bit for bit.
#include <catch2/catch.hpp>

#include "polyshard/nn/nn.hpp"

using namespace polyshard;

TEST_CASE("checkpointed blocks give identical gradients and keep fewer activations", "[nn]") {
  GptConfig cfg{.vocab_size = 32, .block_size = 16, .n_layer = 3, .n_head = 2, .n_embd = 16};
  auto x = Tensor<std::int32_t>::empty({4, 16}), y = Tensor<std::int32_t>::empty({4, 16});
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    x.data()[i] = std::int32_t(splitmix64(i) % 32);
    y.data()[i] = std::int32_t(splitmix64(i + 1000) % 32);
  }
  auto run = [&](bool checkpointing, std::int64_t& peak_activations) {
    Gpt<float> model(cfg);
    model.checkpoint_blocks = checkpointing;
    FlatParameters<float> flat(model);
    flat.initialize(5);
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    Var<float> loss = model.loss(x, y);
    peak_activations = tracker.peak(MemoryCategory::Activations);
    backward(loss);
    return std::pair{loss.value().data()[0], flat.grads().to_vector()};
  };
  std::int64_t plain_peak = 0, ckpt_peak = 0;
  const auto [plain_loss, plain_grads] = run(false, plain_peak);
  const auto [ckpt_loss, ckpt_grads] = run(true, ckpt_peak);
  CHECK(plain_loss == ckpt_loss);
  CHECK(plain_grads == ckpt_grads);
  CHECK(ckpt_peak < plain_peak / 2);
}
