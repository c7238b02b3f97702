// Engine::backward_and_step: under an offloaded optimizer, each unit's step is handed to a host
// thread as soon as its reduced gradients land, while backward goes on. Held bit for bit to
// backward() then step() (which the oracle tests hold to the reference trainer), at world sizes
// 1 and 3, with clipping, a dynamic loss scale and gradient accumulation, and shown to hand
// units over before backward ends.
#include <catch2/catch.hpp>

#include <bit>

#include "engine_fixture.hpp"

using namespace polyshard;

namespace {

constexpr double no_clip = std::numeric_limits<double>::infinity();

/// What a rank ended with: every loss and step result, the master weights and optimizer state
/// it holds, its compute-dtype parameters, and how many units were handed over in backward.
struct RankRun {
  std::vector<float> losses;
  std::vector<bool> applied;
  std::vector<std::vector<float>> masters, state;
  test::Parameters parameters;
  std::vector<double> grad_norms;
  std::vector<std::size_t> handed_off;
};

/// How a step's micro-batches reach the optimizer.
enum class How {
  apart,     // backward for each; step after the last
  quiet,     // as apart, every backward but the last under no_sync
  together,  // backward for each but the last, which runs backward_and_step
  counted,   // gradient_accumulation_steps = micro: backward_and_step for each, the engine counting
};

/// Trains a 3-block GPT (4 units) under S for `steps` steps of `micro` micro-batches each, as
/// `how` says.
template <class S, class Opt>
RankRun train(ThreadCommunicator& comm, How how, typename Opt::config_type opt, double clip, int micro,
              StrategyConfig config, int steps = 3) {
  if (how == How::counted) config.gradient_accumulation_steps = micro;
  RankRun run;
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  GptConfig shape = test::tiny_gpt();
  shape.n_layer = 3;
  Gpt<float> model(shape);
  Engine<S, Gpt<float>, ThreadCommunicator, Opt> engine(model, comm, opt, config, 42);
  engine.track_grad_norm(true);
  BatchSampler sampler(test::tiny_data(), 8, 6, 7);
  const RowRange rows = rank_rows(6, comm.rank(), comm.size());
  const double weight = double(rows.end - rows.begin) / 6.0 / micro;
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < micro; ++m) {
      const Batch b = sampler.batch(step * micro + m, comm.rank(), comm.size());
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      run.losses.push_back(loss.value().data()[0]);
      if (how == How::counted) {
        // The micro-batch's share; the engine divides by the accumulation steps (a power of 2
        // here: the same weight, bit for bit).
        const bool applied = engine.backward_and_step(loss, weight * micro, opt.lr, clip);
        if (m + 1 == micro) {
          run.applied.push_back(applied);
          run.handed_off.push_back(engine.units_handed_off_in_backward());
        } else if (applied || engine.units_handed_off_in_backward() != 0) {
          throw std::logic_error("a micro-batch before the step's last updated, or handed units to the host step");
        }
      } else if (m + 1 < micro) {
        std::optional<typename decltype(engine)::NoSync> quiet;
        if (how == How::quiet) quiet.emplace(engine);
        engine.backward(loss, weight);
      } else if (how == How::together) {
        run.applied.push_back(engine.backward_and_step(loss, weight, opt.lr, clip));
        run.handed_off.push_back(engine.units_handed_off_in_backward());
      } else {
        engine.backward(loss, weight);
        run.applied.push_back(engine.step(opt.lr, clip));
      }
    }
    run.grad_norms.push_back(engine.last_grad_norm());
  }
  for (std::size_t i = 0; i < engine.unit_states().size(); ++i) {
    engine.access_optimizer(i, [&](auto& o, std::span<float> params) {
      run.masters.emplace_back(params.begin(), params.end());
      for (auto& [name, t] : o.state()) run.state.push_back(t.to_vector());
    });
  }
  run.parameters = engine.full_parameters();
  return run;
}

/// Runs apart (under no_sync where the engine counts) and as `how` says on `world` thread ranks
/// and requires every rank's results to be equal bit for bit; returns rank 0's run as `how` says.
template <class S, class Opt = Sgd<float>>
RankRun both_ways(int world, typename Opt::config_type opt, double clip, int micro = 1, StrategyConfig config = {},
                  How how = How::together) {
  std::vector<RankRun> apart(static_cast<std::size_t>(world)), together(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    const How reference = how == How::counted ? How::quiet : How::apart;
    apart[static_cast<std::size_t>(comm.rank())] = train<S, Opt>(comm, reference, opt, clip, micro, config);
  });
  run_ranks(world, [&](ThreadCommunicator& comm) {
    together[static_cast<std::size_t>(comm.rank())] = train<S, Opt>(comm, how, opt, clip, micro, config);
  });
  for (std::size_t r = 0; r < apart.size(); ++r) {
    INFO("rank " << r);
    CHECK(together[r].losses == apart[r].losses);
    CHECK(together[r].applied == apart[r].applied);
    CHECK(together[r].masters == apart[r].masters);
    CHECK(together[r].state == apart[r].state);
    CHECK(together[r].parameters == apart[r].parameters);
    // NaN after a skipped step on both sides: compared as bits.
    REQUIRE(together[r].grad_norms.size() == apart[r].grad_norms.size());
    for (std::size_t s = 0; s < apart[r].grad_norms.size(); ++s)
      CHECK(std::bit_cast<std::uint64_t>(together[r].grad_norms[s]) ==
            std::bit_cast<std::uint64_t>(apart[r].grad_norms[s]));
  }
  return together[0];
}

using PerBlock = WrapByType<Block>;
using Offloaded = std::tuple<Strategy<ShardGradients, OffloadOptimizer<Cpu>, PerBlock, Bf16Mixed>,
                             Strategy<ShardOptimizerState, OffloadOptimizer<Cpu>, PerBlock, Bf16Mixed>,
                             Strategy<ShardParameters<true>, OffloadParameters<Cpu>, PerBlock, Bf16Mixed>,
                             Strategy<ShardParameters<false>, OffloadOptimizer<Cpu>, PerBlock>,
                             Strategy<ShardGradients, OffloadOptimizer<Cpu>, PerBlock>>;

}  // namespace

TEMPLATE_LIST_TEST_CASE("backward_and_step equals backward then step bit for bit, stepping units as they land",
                        "[engine][offload]", Offloaded) {
  for (const int world : {1, 3}) {
    INFO("world size " << world);
    SECTION("momentum SGD, world " + std::to_string(world)) {
      const RankRun run = both_ways<TestType>(world, test::momentum_sgd(), no_clip);
      // With overlap_comm a block's reduction may complete behind the next one's backward: at
      // least the last two blocks land while backward goes on (all three where the reduction
      // completes at once), the first at the latest at the root's end.
      for (const std::size_t n : run.handed_off) CHECK(n >= 2);
    }
    SECTION("AdamW, world " + std::to_string(world)) {
      both_ways<TestType, AdamW<float>>(world, AdamWConfig{.lr = 1e-2, .weight_decay = 0.1}, no_clip);
    }
    SECTION("clipping: the units are checked as they land and updated after the global norm, world " +
            std::to_string(world)) {
      const RankRun run = both_ways<TestType>(world, test::momentum_sgd(), 0.05);
      for (const std::size_t n : run.handed_off) CHECK(n >= 2);
    }
    SECTION("two micro-batches, the second stepping, world " + std::to_string(world)) {
      both_ways<TestType>(world, test::momentum_sgd(), no_clip, 2);
    }
    SECTION("two micro-batches counted by the engine (gradient_accumulation_steps), world " + std::to_string(world)) {
      const RankRun run = both_ways<TestType>(world, test::momentum_sgd(), no_clip, 2, {}, How::counted);
      for (const std::size_t n : run.handed_off) CHECK(n >= 2);  // the last micro-batch steps as units land
    }
  }
}

TEST_CASE("backward_and_step without overlap_comm hands each block over at its own backward's end",
          "[engine][offload]") {
  StrategyConfig config;
  config.overlap_comm = false;
  const RankRun run = both_ways<Strategy<ShardGradients, OffloadOptimizer<Cpu>, PerBlock, Bf16Mixed>>(
      2, test::momentum_sgd(), no_clip, 1, config);
  CHECK(run.handed_off == std::vector<std::size_t>(3, 3));
}

TEST_CASE("backward_and_step under a dynamic loss scale: steps unscaled, or skipped on overflow, alike",
          "[engine][offload]") {
  using Fp16 = Strategy<ShardGradients, OffloadOptimizer<Cpu>, PerBlock, Fp16Mixed>;
  // From the default scale, 65536, the tiny model's gradients stay finite: every step unscales.
  const RankRun unscaled = both_ways<Fp16>(3, test::momentum_sgd(), no_clip);
  CHECK(unscaled.applied == std::vector<bool>(3, true));
  // From 2^40 every step overflows and is skipped, halving the scale.
  StrategyConfig config;
  config.initial_scale_power = 40;
  config.hysteresis = 1;
  const RankRun skipped = both_ways<Fp16>(3, test::momentum_sgd(), no_clip, 1, config);
  CHECK(skipped.applied == std::vector<bool>(3, false));
}

TEST_CASE("backward_and_step without an offloaded optimizer is backward then step", "[engine]") {
  const RankRun run = both_ways<Strategy<ShardGradients, PerBlock, Bf16Mixed>>(2, test::momentum_sgd(), no_clip);
  CHECK(run.handed_off == std::vector<std::size_t>(3, 0));
}

TEST_CASE("backward_and_step inside no_sync is refused", "[engine][offload]") {
  std::string error;
  run_ranks(1, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<Strategy<ShardGradients, OffloadOptimizer<Cpu>, PerBlock, Bf16Mixed>, Gpt<float>, ThreadCommunicator,
           Sgd<float>>
        engine(model, comm, test::momentum_sgd());
    BatchSampler sampler(test::tiny_data(), 8, 2, 7);
    const Batch b = sampler.batch(0, 0, 1);
    Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
    auto quiet = engine.no_sync();
    try {
      engine.backward_and_step(loss, 1.0, 0.1);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  CHECK_THAT(error, Catch::Contains("inside no_sync"));
}
