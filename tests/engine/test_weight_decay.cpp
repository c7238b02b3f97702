// Parameters exempt from weight decay (Parameter::set_weight_decay(false); decay_matrices_only(),
// the rule of nanoGPT and Hugging Face): the optimizer steps them as PyTorch steps a parameter
// group with weight_decay=0, and every other parameter with the decay, under every sharding as
// in one process.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "engine_fixture.hpp"
#include "io/temp_dir.hpp"
#include "polyshard/engine/optimizer_groups.hpp"

using namespace polyshard;

namespace {

/// AdamW with a large decay, so that a parameter stepped with or without it tells at once.
const AdamWConfig adamw{.lr = 1e-2, .weight_decay = 0.1};
constexpr int steps = 3;

/// The oracle, without the engine: one process, flat buffers, and AdamW run parameter by
/// parameter, with weight_decay 0 for the parameters decay_matrices_only() exempts (when
/// `matrices_only`; else every parameter decays).
test::Parameters reference(bool matrices_only) { return test::adamw_matrices_only(steps, adamw, matrices_only); }

/// Rank 0's parameters before and after training tiny_gpt() under S with AdamW on `world`
/// thread ranks, decay_matrices_only() applied first when `matrices_only`. `loss_weight` 0 gives
/// every step zero gradients.
struct DecayRun {
  test::Parameters initial, final;
};
template <class S>
DecayRun train_decay(int world, bool matrices_only, const StrategyConfig& config = {}, double loss_weight = 1,
                     int step_count = steps) {
  std::vector<DecayRun> runs(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    DecayRun& run = runs[static_cast<std::size_t>(comm.rank())];
    Gpt<float> model(test::tiny_gpt());
    if (matrices_only) decay_matrices_only(model);
    Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, adamw, config, 42);
    run.initial = engine.full_parameters();
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    const RowRange rows = rank_rows(6, comm.rank(), world);
    const double weight = loss_weight * double(rows.end - rows.begin) / 6.0;
    for (int step = 0; step < step_count; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, weight);
      engine.step(adamw.lr);
    }
    run.final = engine.full_parameters();
  });
  return std::move(runs[0]);
}

/// The names of tiny_gpt()'s parameters of fewer than two dimensions, from their shapes.
std::set<std::string> vector_parameters() {
  Gpt<float> model(test::tiny_gpt());
  std::set<std::string> names;
  visit_parameters(model, [&](const std::string& name, Parameter<float>& p) {
    if (p.shape().rank() < 2) names.insert(name);
  });
  return names;
}

using test::FsdpPerBlock;
using Sharded = std::tuple<DDP, ZeRO<2>, ZeRO<3>, FsdpPerBlock>;

}  // namespace

TEST_CASE("weight_decay_runs cuts an optimizer span where the decay changes, padding with the parameter before",
          "[engine]") {
  using R = std::vector<std::pair<std::int64_t, bool>>;
  // Parameters at 0 (4 elements, decayed), 4 (2, exempt), 6 (5, decayed), 11 (1, exempt); 12 padded to 14.
  const std::vector<std::int64_t> offsets{0, 4, 6, 11};
  const std::vector<bool> decays{true, false, true, false};
  CHECK(weight_decay_runs(offsets, decays, 0, 14) == R{{4, true}, {2, false}, {5, true}, {3, false}});
  CHECK(weight_decay_runs(offsets, decays, 5, 3) == R{{1, false}, {2, true}});  // a shard from the middle
  CHECK(weight_decay_runs(offsets, decays, 7, 4) == R{{4, true}});
  CHECK(weight_decay_runs(offsets, {true, true, true, true}, 0, 14) == R{{14, true}});
  CHECK(weight_decay_runs({}, {}, 0, 4) == R{{4, true}});  // a unit of padding only
  CHECK(weight_decay_runs(offsets, decays, 12, 0) == R{{0, true}});
}

TEST_CASE("without_weight_decay is the config with weight_decay 0, and nothing for a config without one",
          "[engine][optim]") {
  CHECK(without_weight_decay(adamw)->weight_decay == 0);
  CHECK(without_weight_decay(adamw)->lr == adamw.lr);
  const AnyOptimizerConfig sgd = SgdConfig{.lr = 0.5, .momentum = 0.9, .weight_decay = 0.3};
  const auto exempt = without_weight_decay(sgd);
  REQUIRE(exempt.has_value());
  CHECK(std::get<SgdConfig>(*exempt).weight_decay == 0);
  CHECK(std::get<SgdConfig>(*exempt).momentum == 0.9);
  struct NoDecay {
    double lr = 1;
  };
  CHECK_FALSE(without_weight_decay(NoDecay{}).has_value());
}

TEST_CASE("decay_matrices_only exempts the biases and norms of GPT and decays its matrices", "[engine]") {
  Gpt<float> model(test::tiny_gpt());
  // Per block: ln_1's and ln_2's weight and bias, and the biases of c_attn, c_proj, c_fc and
  // the MLP's c_proj; then ln_f's weight and bias.
  CHECK(decay_matrices_only(model) == 2 * 8 + 2);
  CHECK_FALSE(model.transformer.ln_f.bias.has_weight_decay());
  CHECK(model.transformer.wte.weight.has_weight_decay());
  CHECK(model.transformer.h[1].mlp.c_fc.weight.has_weight_decay());
}

TEST_CASE("a zero gradient: decayed parameters shrink by lr x weight_decay, exempt ones stay bit for bit",
          "[engine]") {
  // AdamW with a zero gradient moves nothing but the decay: p <- p (1 - lr wd). Sharded three
  // ways, the exempt ranges fall inside shards and across their bounds.
  const float shrink = static_cast<float>(1 - adamw.lr * adamw.weight_decay);
  const DecayRun run = train_decay<ZeRO<3>>(3, true, {}, /*loss_weight=*/0, /*step_count=*/1);
  const std::set<std::string> vectors = vector_parameters();
  REQUIRE(vectors.size() == 18);
  std::size_t checked = 0;
  for (std::size_t i = 0; i < run.initial.size(); ++i) {
    const auto& [name, before] = run.initial[i];
    const auto& after = run.final[i].second;
    REQUIRE(run.final[i].first == name);
    CAPTURE(name);
    const bool exempt = vectors.count(name) > 0;
    for (std::size_t k = 0; k < before.size(); ++k) {
      if (exempt) CHECK(after[k] == before[k]);
      else CHECK(after[k] == before[k] * shrink);
      ++checked;
    }
  }
  CHECK(checked > 500);
}

TEST_CASE("the one-process oracle: exempt parameters train without weight decay, the others with it", "[engine]") {
  const auto exempt = reference(true), decayed = reference(false);
  // The exemption changes what trains: by the decay's own size, lr x wd x |p| a step.
  CHECK(test::max_difference(exempt, decayed) > 1e-4);
  // Without exemptions the oracle is the engine's one-process run, and with them too.
  CHECK(test::max_difference(decayed, train_decay<DDP>(1, false).final) == 0.0);
  CHECK(test::max_difference(exempt, train_decay<DDP>(1, true).final) == 0.0);
}

TEMPLATE_LIST_TEST_CASE("exempt parameters train as in one process under every sharding", "[engine]", Sharded) {
  const auto ref = reference(true);
  for (int world : {1, 3}) {
    CAPTURE(world);
    const DecayRun run = train_decay<TestType>(world, true);
    if (world == 1) CHECK(test::max_difference(run.final, ref) == 0.0);
    // Across world sizes only the order of sums differs (Adam magnifies it: see test_equivalence).
    CHECK(test::max_difference(run.final, ref) < 0.01 * adamw.lr);
    // In sub-groups of 37 elements, cut anywhere by shard bounds and the exempt ranges: the same bits.
    StrategyConfig pieces;
    pieces.sub_group_size = 37;
    CHECK(test::max_difference(train_decay<TestType>(world, true, pieces).final, run.final) == 0.0);
  }
}

TEST_CASE("exempt parameters: the sharded stages agree bit for bit at world size 2", "[engine]") {
  const DecayRun zero2 = train_decay<ZeRO<2>>(2, true);
  CHECK(test::max_difference(train_decay<FsdpPerBlock>(2, true).final, zero2.final) == 0.0);
  CHECK(test::max_difference(train_decay<ZeRO<3>>(2, true).final, zero2.final) == 0.0);
}

#ifdef POLYSHARD_HAVE_LIBURING
TEST_CASE("exempt parameters with the optimizer state or the parameter shards on NVMe train bit for bit as in memory",
          "[engine][nvme]") {
  // The sub-groups that come back from the file one at a time are cut at the exempt ranges too.
  using InMemory = Strategy<ShardParameters<true>, WrapByType<Block>>;
  using StateOnNvme = with_t<InMemory, OffloadOptimizer<Nvme>>;
  using ShardsOnNvme = with_t<InMemory, OffloadParameters<Nvme>>;
  TempDir dir;
  StrategyConfig config;
  config.nvme_path = dir.path().string();
  config.optimizer_buffer_count = nvme_buffers_per_sub_group(2);  // one AdamW sub-group in memory at a time
  StrategyConfig shards = config;
  shards.max_in_cpu = 0;  // every unit's shard in the file
  for (int world : {1, 3}) {
    CAPTURE(world);
    const DecayRun in_memory = train_decay<InMemory>(world, true);
    CHECK(test::max_difference(train_decay<StateOnNvme>(world, true, config).final, in_memory.final) == 0.0);
    CHECK(test::max_difference(train_decay<ShardsOnNvme>(world, true, shards).final, in_memory.final) == 0.0);
    // ...and the exemption is in effect there: it is not the run that decays everything.
    CHECK(test::max_difference(train_decay<StateOnNvme>(world, false, config).final, in_memory.final) > 1e-4);
  }
}
#endif
