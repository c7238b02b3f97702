// Manual wrapping and frozen parameters: each Block marked as a unit inside a sharded-
// construction context, the token embedding frozen, two ranks training under ZeRO-3. The
// program checks the units, that no rank ever held more than its shards at start-up, and that
// the frozen embedding did not move; it exits 1 if one check fails.
#include <atomic>
#include <cstdio>
#include <cstring>

#include <polyshard/comm/thread_communicator.hpp>
#include <polyshard/data/data.hpp>
#include <polyshard/engine/engine.hpp>
#include <polyshard/engine/sharded_construction.hpp>
#include <polyshard/nn/nn.hpp>
#include <polyshard/optim/optim.hpp>
#include <polyshard/policy/policy.hpp>

using namespace polyshard;

int main() {
  const GptConfig config{.vocab_size = 256, .block_size = 32, .n_layer = 3, .n_head = 2, .n_embd = 32};
  const TextDataset data = TextDataset::from_text(builtin_corpus(1 << 16));
  std::atomic<bool> ok = true;
  std::vector<std::string> report(2);

  run_ranks(2, [&](ThreadCommunicator& comm) {
    MemoryTracker memory;
    TrackerScope scope(memory);
    // [manual-wrap]
    ShardedConstruction ctx;
    Gpt<float> model(config);                             // allocates no parameter storage
    for (auto& block : model.transformer.h) wrap(block);  // each Block is a unit
    Engine<Strategy<ShardParameters<true>, ManualWrap>, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(
        model, comm, AdamWConfig{.lr = 1e-2, .weight_decay = 0.1});
    // [manual-wrap]
    const std::int64_t shard_bytes = engine.units().padded_total() / comm.size() * std::int64_t(sizeof(float));
    const bool units_ok = engine.units().units.size() == std::size_t(config.n_layer) + 1;
    const bool peak_ok = memory.peak(MemoryCategory::Parameters) == shard_bytes;

    const auto before = engine.full_parameters();
    // [freeze]
    model.transformer.wte.weight.set_requires_grad(false);  // no reduction, no update, no decay
    engine.refresh_trainable();
    // [freeze]
    const BatchSampler sampler(data, config.block_size, 8, /*seed=*/1);
    for (int step = 0; step < 3; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), comm.size());
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, 0.5);
      engine.step(1e-2);
    }
    const auto after = engine.full_parameters();
    bool frozen_ok = false, others_moved = false;
    for (std::size_t i = 0; i < after.size(); ++i) {
      const bool same = std::memcmp(before[i].second.data(), after[i].second.data(),
                                    after[i].second.size() * sizeof(float)) == 0;
      if (after[i].first == "transformer.wte.weight") frozen_ok = same;
      else others_moved = others_moved || !same;
    }
    char line[256];
    std::snprintf(line, sizeof line, "rank %d: %zu units%s, start-up peak %lld bytes (shards %lld)%s, wte %s, others %s",
                  comm.rank(), engine.units().units.size(), units_ok ? "" : " (WRONG)",
                  static_cast<long long>(memory.peak(MemoryCategory::Parameters)), static_cast<long long>(shard_bytes),
                  peak_ok ? "" : " (WRONG)", frozen_ok ? "unchanged" : "CHANGED", others_moved ? "trained" : "UNCHANGED");
    report[static_cast<std::size_t>(comm.rank())] = line;
    if (!(units_ok && peak_ok && frozen_ok && others_moved)) ok = false;
  });
  for (const auto& line : report) std::printf("%s\n", line.c_str());
  if (!ok) return 1;
  std::printf("manual wrap: every check passed\n");
  return 0;
}
