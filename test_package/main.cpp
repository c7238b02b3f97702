// Conan test program: a custom strategy composed from polyshard's policies, checked at compile
// time and instantiated over a tiny GPT.
#include <iostream>

#include <polyshard/nn/nn.hpp>
#include <polyshard/policy/policy.hpp>

using namespace polyshard;

// FSDP's SHARD_GRAD_OP (parameters sharded, kept gathered between forward and backward) in bf16.
using Custom = Strategy<Bf16Mixed, ShardParameters<false>, WrapByType<Block>>;
static_assert(Custom::sharding::shards_parameters);
static_assert(std::is_same_v<Custom::compute_type, bfloat16>);

int main() {
  Gpt<float> model({.vocab_size = 32, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16});
  FlatParameters<float> flat(model, 2);
  flat.initialize(1);
  std::cout << "polyshard test_package: " << flat.numel() << " parameters, "
            << model_state_bytes<Custom>(flat.padded_numel(), 2) << " model-state bytes per rank at 2 ranks\n";
  return flat.numel() == count_parameters(model) ? 0 : 1;
}
