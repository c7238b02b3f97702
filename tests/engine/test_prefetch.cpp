// Prefetching the next units' gathers: the same collectives, issued earlier, so the same bits and
// the same bytes; a rank holds one more gathered unit at its peak, or as many more as
// stage3_prefetch_bucket_size's budget allows.
#include <catch2/catch.hpp>

#include <optional>

#include "engine_fixture.hpp"

using namespace polyshard;

namespace {

struct Observed {
  test::Parameters parameters;
  double bytes_sent = 0;
  std::int64_t parameter_peak = 0, block_bytes = 0;
};

/// Prefetch off, the next unit (the default budget), or `budget` elements ahead.
template <class S>
Observed run_with(bool prefetch, int world, std::optional<std::int64_t> budget = std::nullopt) {
  std::vector<Observed> seen(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Observed& o = seen[static_cast<std::size_t>(comm.rank())];
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    GptConfig config = test::tiny_gpt();
    config.n_layer = 4;
    Gpt<float> model(config);
    StrategyConfig strategy_config;
    strategy_config.prefetch = prefetch;
    strategy_config.stage3_prefetch_bucket_size = budget;
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), strategy_config, 42);
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    const RowRange rows = rank_rows(6, comm.rank(), world);
    const double weight = double(rows.end - rows.begin) / 6.0;
    for (int step = 0; step < 3; ++step) {
      if (step == 2) {
        tracker.reset_peaks();  // the order is recorded: steps from here on prefetch
        engine.reset_stats();
      }
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, weight);
      loss = Var<float>();
      engine.step(0.1);
    }
    o.parameter_peak = tracker.peak(MemoryCategory::Parameters);
    o.bytes_sent = engine.bytes_sent();
    o.block_bytes = engine.units().units[1].padded * std::int64_t(sizeof(float));
    o.parameters = engine.full_parameters();
  });
  return std::move(seen[0]);
}

}  // namespace

using Prefetching = std::tuple<Strategy<ShardParameters<true>, WrapByType<Block>>,
                               Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>,
                               Strategy<HybridShard<ShardParameters<true>>, WrapByType<Block>>>;

TEMPLATE_LIST_TEST_CASE("prefetching the next unit changes no bit and no byte, and holds one more unit", "[engine]",
                        Prefetching) {
  for (const int world : {1, 2, 3}) {
    CAPTURE(world);
    const Observed off = run_with<TestType>(false, world), on = run_with<TestType>(true, world);
    CHECK(on.parameters == off.parameters);
    CHECK(on.bytes_sent == off.bytes_sent);
    // Without prefetch one block is gathered at a time; with it, the next one too. (With 16-bit
    // compute the gathered buffer is released once the float copy the CPU computes with is made,
    // so the Parameters peak does not show it.)
    if constexpr (std::is_same_v<typename TestType::compute_type, float>)
      CHECK(on.parameter_peak - off.parameter_peak == on.block_bytes);
  }
}

TEMPLATE_LIST_TEST_CASE("stage3_prefetch_bucket_size prefetches as many units as it holds, at least the next one, "
                        "changing no bit and no byte",
                        "[engine]", Prefetching) {
  for (const int world : {1, 2, 3}) {
    CAPTURE(world);
    const Observed off = run_with<TestType>(false, world);
    const Observed one = run_with<TestType>(true, world, 1);                // under one unit: the next one still
    const Observed all = run_with<TestType>(true, world, 1'000'000'000);    // every unit ahead
    const Observed two = run_with<TestType>(true, world, 2 * off.block_bytes / 4);  // two blocks exactly
    for (const Observed* o : {&one, &all, &two}) {
      CHECK(o->parameters == off.parameters);
      CHECK(o->bytes_sent == off.bytes_sent);
    }
    if constexpr (std::is_same_v<typename TestType::compute_type, float>) {
      // Four blocks: while the first runs, one, three or two more are gathered ahead.
      CHECK(one.parameter_peak - off.parameter_peak == off.block_bytes);
      CHECK(all.parameter_peak - off.parameter_peak == 3 * off.block_bytes);
      CHECK(two.parameter_peak - off.parameter_peak == 2 * off.block_bytes);
    }
  }
}
