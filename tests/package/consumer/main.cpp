// Uses an installed polyshard: composes a custom strategy from its policies, builds a tiny GPT
// on flat parameters, and prints what the strategy type predicts for it.
#include <iostream>

#include <polyshard/polyshard.hpp>  // every layer, as a newcomer's first include

using namespace polyshard;

// ZeRO-2 (sharded gradients and optimizer state) with bf16 compute and fp32 master weights.
using MyStrategy = Strategy<ShardGradients, Bf16Mixed>;
static_assert(MyStrategy::sharding::shards_gradients && !MyStrategy::sharding::shards_parameters);
static_assert(std::is_same_v<MyStrategy::master_type, float>);

int main() {
  Gpt<float> model({.vocab_size = 64, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32});
  FlatParameters<float> flat(model, /*pad_to=*/4);
  flat.initialize(/*seed=*/0);
  const std::int64_t n = flat.numel();
  // A forward and backward through the CPU kernels (the precompiled ones, in precompiled_consumer).
  Tensor<std::int32_t> ids = Tensor<std::int32_t>::empty({2, 16}), targets = Tensor<std::int32_t>::empty({2, 16});
  for (std::int64_t i = 0; i < 32; ++i) {
    ids.data()[i] = std::int32_t((7 * i) % 64);
    targets.data()[i] = std::int32_t((7 * i + 1) % 64);
  }
  const Var<float> loss = model.loss(ids, targets);
  backward(loss);
  std::cout << "parameters: " << n << "\n"
            << "loss: " << loss.item() << "\n"
            << "model-state bytes per rank at 4 ranks (Adam): " << model_state_bytes<MyStrategy>(flat.padded_numel(), 4)
            << "\n";
  return n == count_parameters(model) ? 0 : 1;
}
