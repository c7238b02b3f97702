// What a researcher's translation unit costs to compile: one strategy's engine over the built-in
// GPT, with a forward, a backward and a step. benchmarks/compile/compile_time.sh times it.
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/data/batches.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/presets.hpp"

using namespace polyshard;

int main() {
  const TextDataset data = TextDataset::from_text("a small corpus, long enough for one window of text", "inline");
  run_ranks(2, [&](ThreadCommunicator& comm) {
    Gpt<float> model({.vocab_size = 256, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16});
    Engine<ZeRO<3>, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{});
    const BatchSampler sampler(data, 8, 2, 1);
    const Batch b = sampler.batch(0, comm.rank(), comm.size());
    auto loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
    engine.backward(loss, 0.5);
    engine.step(1e-3);
  });
}
