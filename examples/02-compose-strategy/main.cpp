// A first polyshard program: compose a strategy from policies and train a small GPT with it on
// two ranks (threads), then save the trained weights as a safetensors state dict.
#include <cstdio>

#include <polyshard/comm/thread_communicator.hpp>
#include <polyshard/data/data.hpp>
#include <polyshard/engine/engine.hpp>
#include <polyshard/io/full_weights.hpp>
#include <polyshard/nn/nn.hpp>
#include <polyshard/optim/optim.hpp>

using namespace polyshard;

// [strategy]
// ZeRO-2: gradients and optimizer state sharded over the ranks, parameters replicated;
// bf16 compute and gradient reduction with fp32 master weights.
using MyStrategy = Strategy<ShardGradients, Bf16Mixed>;

static_assert(MyStrategy::sharding::shards_gradients);
static_assert(std::is_same_v<MyStrategy::compute_type, bfloat16>);
static_assert(std::is_same_v<MyStrategy::master_type, float>);
// [strategy]

int main(int argc, char** argv) {
  const char* out = argc > 1 ? argv[1] : "compose-strategy.safetensors";
  const GptConfig config{.vocab_size = 256, .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 32};
  const TextDataset data = TextDataset::from_text(builtin_corpus(1 << 16));
  const std::int64_t global_batch = 8;

  // [train]
  run_ranks(2, [&](ThreadCommunicator& comm) {
    Gpt<float> model(config);
    Engine<MyStrategy, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{.lr = 3e-3});
    const BatchSampler sampler(data, config.block_size, global_batch, /*seed=*/1);
    const RowRange rows = rank_rows(global_batch, comm.rank(), comm.size());
    const double share = double(rows.end - rows.begin) / double(global_batch);
    for (int step = 0; step < 5; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), comm.size());
      engine.zero_grad();
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      if (comm.rank() == 0) std::printf("step %d  loss %.4f (rank 0's rows)\n", step, loss.value().data()[0]);
      engine.backward(loss, share);
      engine.step(3e-3);
    }
    // [train]

    // [save]
    // The whole model, gathered from every rank's shard of the fp32 master weights (a
    // collective), saved by rank 0 under PyTorch's names; lm_head.weight is written as the tied
    // alias PyTorch's state_dict() lists.
    save_full_weights(engine, out, tied_parameters<Gpt<float>>::of(model));
    if (comm.rank() == 0)
      std::printf("saved %lld parameters to %s\n", static_cast<long long>(engine.units().numel_total()), out);
    // [save]
  });
  return 0;
}
