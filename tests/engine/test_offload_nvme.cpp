// ZeRO-Infinity (ShardParameters + OffloadOptimizer<Nvme>): the optimizer state lives in a file
// under nvme_path between steps and training is bit for bit that of ZeRO-3 in memory.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"
#include "io/temp_dir.hpp"

using namespace polyshard;
using test::max_difference;
using test::train;

namespace {

using ZeRO3PerBlock = with_t<ZeRO<3>, WrapByType<Block>>;
using InfinityPerBlock = with_t<ZeROInfinity, WrapByType<Block>>;
constexpr double no_clip = std::numeric_limits<double>::infinity();

StrategyConfig nvme_config(const TempDir& dir, std::int64_t block_size, int queue_depth, int buffers, bool pin) {
  StrategyConfig c;
  c.nvme_path = dir.path().string();
  c.block_size = block_size;
  c.queue_depth = queue_depth;
  c.optimizer_buffer_count = buffers;
  c.pin_memory = pin;
  return c;
}

std::size_t files_in(const std::filesystem::path& dir) {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

/// Every unit's optimizer state on this rank, read through access_optimizer.
template <class E>
std::vector<std::vector<float>> optimizer_states(E& engine) {
  std::vector<std::vector<float>> out;
  for (std::size_t u = 0; u < engine.units().units.size(); ++u)
    engine.access_optimizer(u, [&](auto& opt, auto) {
      for (const auto& [name, t] : opt.state()) out.push_back(t.to_vector());
    });
  return out;
}

}  // namespace

TEST_CASE("ZeRO-Infinity with AdamW trains bit for bit like ZeRO-3 at world sizes 1, 2 and 4", "[engine][nvme]") {
  const AdamWConfig adamw{.lr = 1e-2};
  // The defaults (1 MiB blocks, 8 in flight, 4 units in memory), and 4 KiB blocks with fewer in
  // flight than a unit has blocks and one or two units in memory, pinned or not.
  const auto [block, depth, buffers, pin] = GENERATE(std::tuple<std::int64_t, int, int, bool>{1'048'576, 8, 4, false},
                                                     std::tuple<std::int64_t, int, int, bool>{4096, 1, 1, false},
                                                     std::tuple<std::int64_t, int, int, bool>{4096, 2, 2, true});
  const int world = GENERATE(1, 2, 4);
  CAPTURE(block, depth, buffers, pin, world);
  TempDir dir;
  const StrategyConfig config = nvme_config(dir, block, depth, buffers, pin);

  const auto whole = train<ZeRO<3>, AdamW<float>>(world, 3, 6, adamw);
  const auto whole_nvme = train<ZeROInfinity, AdamW<float>>(world, 3, 6, adamw, no_clip, config);
  CHECK(max_difference(whole_nvme.parameters, whole.parameters) == 0.0);
  CHECK(whole_nvme.losses == whole.losses);

  const auto blocks = train<ZeRO3PerBlock, AdamW<float>>(world, 3, 6, adamw);
  const auto blocks_nvme = train<InfinityPerBlock, AdamW<float>>(world, 3, 6, adamw, no_clip, config);
  CHECK(max_difference(blocks_nvme.parameters, blocks.parameters) == 0.0);
  CHECK(blocks_nvme.losses == blocks.losses);

  // Training moved the parameters, so state read back wrong would have shown.
  CHECK(max_difference(whole.parameters, train<ZeRO<3>, AdamW<float>>(world, 0, 6, adamw).parameters) > 1e-3);
  CHECK(files_in(dir.path()) == 0);  // every file unlinked with its engine
}

TEST_CASE("ZeRO-Infinity: SGD with momentum and mixed precision train like ZeRO-3 too", "[engine][nvme]") {
  TempDir dir;
  const StrategyConfig config = nvme_config(dir, 4096, 2, 2, false);
  const int world = GENERATE(1, 3);
  CAPTURE(world);
  const auto sgd = test::momentum_sgd();
  CHECK(max_difference(train<InfinityPerBlock>(world, 3, 6, sgd, no_clip, config).parameters,
                       train<ZeRO3PerBlock>(world, 3, 6, sgd).parameters) == 0.0);
  // Plain SGD keeps no state: an empty file, and nothing to move.
  const SgdConfig plain{.lr = 0.1};
  CHECK(max_difference(train<InfinityPerBlock>(world, 3, 6, plain, no_clip, config).parameters,
                       train<ZeRO3PerBlock>(world, 3, 6, plain).parameters) == 0.0);
  // bf16 compute with fp32 master weights: the master copy stays in memory, the moments move.
  const AdamWConfig adamw{.lr = 1e-2};
  CHECK(max_difference(train<with_t<InfinityPerBlock, Bf16Mixed>, AdamW<float>>(world, 3, 6, adamw, no_clip, config).parameters,
                       train<with_t<ZeRO3PerBlock, Bf16Mixed>, AdamW<float>>(world, 3, 6, adamw).parameters) == 0.0);
}

TEST_CASE("ZeRO-Infinity: the state is in the file between steps, and access_optimizer reads and restores it",
          "[engine][nvme]") {
  constexpr int world = 2;
  TempDir dir;
  const StrategyConfig config = nvme_config(dir, 4096, 2, 2, false);
  const AdamWConfig adamw{.lr = 1e-2};
  struct Seen {
    std::vector<std::vector<float>> nvme_states, memory_states, restored, after_throw;
    std::int64_t state_bytes_built = -1, state_bytes_between_steps = -1, state_bytes_after_access = -1;
    std::size_t files_while_training = 0;
    bool elements_between_steps = false;  // some state tensor had its elements
    std::string thrown;
  };
  std::vector<Seen> seen(world);
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Seen& s = seen[static_cast<std::size_t>(comm.rank())];
    auto run = [&]<class S>(StrategyConfig c, std::vector<std::vector<float>>& states) {
      MemoryTracker tracker;
      TrackerScope scope(tracker);
      Gpt<float> model(test::tiny_gpt());
      Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, adamw, c, 42);
      constexpr bool nvme = S::offload::to_nvme;
      if (nvme) s.state_bytes_built = tracker.current(MemoryCategory::OptimizerState);
      BatchSampler sampler(test::tiny_data(), 8, 6, 7);
      for (int step = 0; step < 2; ++step) {
        const Batch b = sampler.batch(step, comm.rank(), world);
        Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
        engine.backward(loss, double(b.inputs.size(0)) / 6.0);
        loss = Var<float>();
        engine.step(adamw.lr);
      }
      states = optimizer_states(engine);
      if constexpr (nvme) {
        s.state_bytes_between_steps = tracker.current(MemoryCategory::OptimizerState);
        // Every rank's file exists once every rank has built its engine and stepped: count them
        // between two barriers, so that no rank is still creating its file or already removing it.
        comm.barrier();
        s.files_while_training = files_in(dir.path());
        comm.barrier();
        for (const auto& opt : engine.optimizers())
          for (const auto& [name, t] : opt.state()) s.elements_between_steps |= t.storage()->materialized();
        // A restore writes through to the file: read back, the new values are there.
        engine.access_optimizer(1, [&](auto& opt, auto) {
          for (auto& [name, t] : opt.state()) t.fill(name == "exp_avg" ? 0.25f : 0.5f);
        });
        s.state_bytes_after_access = tracker.current(MemoryCategory::OptimizerState);
        s.restored = optimizer_states(engine);
        // A restore that throws half-way leaves the file as it was.
        try {
          engine.access_optimizer(1, [&](auto& opt, auto) {
            opt.state()[0].second.fill(-1.0f);
            throw Error("checkpoint is corrupt");
          });
        } catch (const Error& e) {
          s.thrown = e.what();
        }
        s.after_throw = optimizer_states(engine);
      }
    };
    run.template operator()<InfinityPerBlock>(config, s.nvme_states);
    run.template operator()<ZeRO3PerBlock>(StrategyConfig{}, s.memory_states);
  });
  for (const Seen& s : seen) {
    CHECK(s.state_bytes_built == 0);
    CHECK(s.state_bytes_between_steps == 0);
    CHECK(s.state_bytes_after_access == 0);
    CHECK_FALSE(s.elements_between_steps);
    CHECK(s.files_while_training == std::size_t(world));  // one file per rank
    REQUIRE(s.nvme_states.size() == 6);                    // 3 units, exp_avg and exp_avg_sq
    CHECK(s.nvme_states == s.memory_states);               // the moments, bit for bit
    CHECK(std::any_of(s.nvme_states[0].begin(), s.nvme_states[0].end(), [](float x) { return x != 0; }));
    // Unit 1's two tensors became 0.25 and 0.5; the others did not change.
    REQUIRE(s.restored.size() == 6);
    for (std::size_t i = 0; i < 6; ++i) {
      if (i == 2 || i == 3) {
        const float v = i == 2 ? 0.25f : 0.5f;
        CHECK(std::all_of(s.restored[i].begin(), s.restored[i].end(), [v](float x) { return x == v; }));
      } else {
        CHECK(s.restored[i] == s.nvme_states[i]);
      }
    }
    CHECK(s.thrown == "checkpoint is corrupt");
    CHECK(s.after_throw == s.restored);
  }
  CHECK(files_in(dir.path()) == 0);
}

TEST_CASE("ZeRO-Infinity: unusable NVMe options are clear errors", "[engine][nvme]") {
  TempDir dir;
  const AdamWConfig adamw{.lr = 1e-2};
  StrategyConfig missing = nvme_config(dir, 4096, 2, 2, false);
  missing.nvme_path = (dir / "not-there").string();
  CHECK_THROWS_WITH((train<ZeROInfinity, AdamW<float>>(1, 1, 6, adamw, no_clip, missing)),
                    Catch::Contains("nvme_path '" + missing.nvme_path + "' does not exist") &&
                        Catch::Contains("the nvme_path option"));
  // The default, DeepSpeed's /local_nvme, is not on this machine: the message says what to set.
  if (!std::filesystem::exists("/local_nvme"))
    CHECK_THROWS_WITH((train<ZeROInfinity, AdamW<float>>(1, 1, 6, adamw)),
                      Catch::Contains("nvme_path '/local_nvme' does not exist"));
  StrategyConfig buffers = nvme_config(dir, 4096, 2, 0, false);
  CHECK_THROWS_WITH((train<ZeROInfinity, AdamW<float>>(1, 1, 6, adamw, no_clip, buffers)),
                    Catch::Contains("optimizer_buffer_count"));
  StrategyConfig block = nvme_config(dir, 1000, 2, 2, false);
  CHECK_THROWS_WITH((train<ZeROInfinity, AdamW<float>>(1, 1, 6, adamw, no_clip, block)), Catch::Contains("block_size"));
  CHECK(files_in(dir.path()) == 0);
}
