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

/// Two steps of tiny_gpt() on this rank's rows of a global batch of 6.
template <class E>
void two_steps(E& engine, Gpt<float>& model, ThreadCommunicator& comm, double lr) {
  BatchSampler sampler(test::tiny_data(), 8, 6, 7);
  for (int step = 0; step < 2; ++step) {
    const Batch b = sampler.batch(step, comm.rank(), comm.size());
    Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
    engine.backward(loss, double(b.inputs.size(0)) / 6.0);
    loss = Var<float>();
    engine.step(lr);
  }
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

/// Rank 0's parameters and optimizer state after two_steps of S with `list` on `world` ranks.
template <class S>
std::pair<test::Parameters, std::vector<std::vector<float>>> list_steps(int world,
                                                                        const OptimizerList<AnyOptimizerConfig>& list,
                                                                        const StrategyConfig& config) {
  std::pair<test::Parameters, std::vector<std::vector<float>>> out;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, AnyOptimizer<float>> engine(model, comm, list, config, 42);
    two_steps(engine, model, comm, 0.05);
    auto parameters = engine.full_parameters();
    auto states = optimizer_states(engine);
    if (comm.rank() == 0) out = {std::move(parameters), std::move(states)};
  });
  return out;
}

}  // namespace

TEST_CASE("ZeRO-Infinity with AdamW trains bit for bit like ZeRO-3 at world sizes 1, 2 and 4", "[engine][nvme]") {
  const AdamWConfig adamw{.lr = 1e-2};
  // The defaults (1 MiB blocks, 8 in flight, 4 buffers: one Adam unit's state in memory at a
  // time), and 4 KiB blocks with fewer in flight than a unit has blocks and one or two units in
  // memory, pinned or not.
  const auto [block, depth, buffers, pin] = GENERATE(std::tuple<std::int64_t, int, int, bool>{1'048'576, 8, 4, false},
                                                     std::tuple<std::int64_t, int, int, bool>{4096, 1, 4, false},
                                                     std::tuple<std::int64_t, int, int, bool>{4096, 2, 8, true});
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
  const StrategyConfig config = nvme_config(dir, 4096, 2, 8, false);
  const int world = GENERATE(1, 3);
  CAPTURE(world);
  const auto sgd = test::momentum_sgd();
  CHECK(max_difference(train<InfinityPerBlock>(world, 3, 6, sgd, no_clip, config).parameters,
                       train<ZeRO3PerBlock>(world, 3, 6, sgd).parameters) == 0.0);
  // Plain SGD keeps no state: an empty file, and nothing to move.
  const SgdConfig plain{.lr = 0.1};
  CHECK(max_difference(train<InfinityPerBlock>(world, 3, 6, plain, no_clip, config).parameters,
                       train<ZeRO3PerBlock>(world, 3, 6, plain).parameters) == 0.0);
  // bf16 compute with fp32 master weights: the master copy goes to the file with the moments (what
  // a rank holds between steps, by category, is test_memory's), and the step brings both back.
  using MixedInfinity = Engine<with_t<InfinityPerBlock, Bf16Mixed>, Gpt<float>, ThreadCommunicator, AdamW<float>>;
  STATIC_REQUIRE_FALSE(MixedInfinity::masters_resident);
  STATIC_REQUIRE(Engine<InfinityPerBlock, Gpt<float>, ThreadCommunicator, AdamW<float>>::masters_resident);
  const AdamWConfig adamw{.lr = 1e-2};
  CHECK(max_difference(train<with_t<InfinityPerBlock, Bf16Mixed>, AdamW<float>>(world, 3, 6, adamw, no_clip, config).parameters,
                       train<with_t<ZeRO3PerBlock, Bf16Mixed>, AdamW<float>>(world, 3, 6, adamw).parameters) == 0.0);
}

TEST_CASE("ZeRO-Infinity: an OptimizerList of SGD with momentum beside Adam trains bit for bit like ZeRO-3",
          "[engine][nvme][optim]") {
  // Sub-groups of 37 elements of two classes, one state value per element and two, in one file:
  // each brought back, stepped and written as its own class.
  const OptimizerList<AnyOptimizerConfig> list{
      {names_starting_with({"transformer.h.1."}), SgdConfig{.lr = 0.05, .momentum = 0.9}},
      {every_parameter(), AdamConfig{.lr = 1e-2}}};
  const int world = GENERATE(1, 3);
  CAPTURE(world);
  TempDir dir;
  StrategyConfig on_nvme = nvme_config(dir, 4096, 2, 4, false), in_memory;
  on_nvme.sub_group_size = in_memory.sub_group_size = 37;
  const auto nvme = list_steps<InfinityPerBlock>(world, list, on_nvme);
  const auto memory = list_steps<ZeRO3PerBlock>(world, list, in_memory);
  CHECK(max_difference(nvme.first, memory.first) == 0.0);
  CHECK(nvme.second == memory.second);
  REQUIRE_FALSE(memory.second.empty());
  CHECK(max_difference(memory.first, list_steps<ZeRO3PerBlock>(world, {list[1]}, in_memory).first) > 1e-3);
}

TEST_CASE("ZeRO-Infinity: the state is in the file between steps, and access_optimizer reads and restores it",
          "[engine][nvme]") {
  constexpr int world = 2;
  TempDir dir;
  StrategyConfig config = nvme_config(dir, 4096, 2, 8, false);
  // In one piece a unit, and in sub-groups of 37 elements, which access_optimizer shows whole.
  config.sub_group_size = GENERATE(StrategyConfig{}.sub_group_size, std::int64_t{37});
  CAPTURE(config.sub_group_size);
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
      two_steps(engine, model, comm, adamw.lr);
      states = optimizer_states(engine);
      if constexpr (nvme) {
        s.state_bytes_between_steps = tracker.current(MemoryCategory::OptimizerState);
        // Every rank's file exists once every rank has built its engine and stepped: count them
        // between two barriers, so that no rank is still creating its file or already removing it.
        comm.barrier();
        s.files_while_training = files_in(dir.path());
        comm.barrier();
        for (const auto& groups : engine.optimizers())
          for (const auto& opt : groups)
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
  StrategyConfig missing = nvme_config(dir, 4096, 2, 8, false);
  missing.nvme_path = (dir / "not-there").string();
  CHECK_THROWS_WITH((train<ZeROInfinity, AdamW<float>>(1, 1, 6, adamw, no_clip, missing)),
                    Catch::Contains("nvme_path '" + missing.nvme_path + "' does not exist") &&
                        Catch::Contains("the nvme_path option"));
  // The default, DeepSpeed's /local_nvme, is not on this machine: the message says what to set.
  if (!std::filesystem::exists("/local_nvme"))
    CHECK_THROWS_WITH((train<ZeROInfinity, AdamW<float>>(1, 1, 6, adamw)),
                      Catch::Contains("nvme_path '/local_nvme' does not exist"));
  StrategyConfig buffers = nvme_config(dir, 4096, 2, 3, false);  // Adam's sub-group takes 4
  CHECK_THROWS_WITH((train<ZeROInfinity, AdamW<float>>(1, 1, 6, adamw, no_clip, buffers)),
                    Catch::Contains("optimizer_buffer_count is 3, fewer than the 4 buffers one sub-group"));
  StrategyConfig block = nvme_config(dir, 1000, 2, 8, false);
  CHECK_THROWS_WITH((train<ZeROInfinity, AdamW<float>>(1, 1, 6, adamw, no_clip, block)), Catch::Contains("block_size"));
  CHECK(files_in(dir.path()) == 0);
}

// ZeRO-Infinity with the parameter shards on NVMe too (OffloadParameters<Nvme>): the shards and
// the fp32 masters live in the file with the optimizer state, read in for each gather and step.
namespace {

using InfinityParametersPerBlock = with_t<ZeROInfinityParameters, WrapByType<Block>>;

StrategyConfig parameter_config(const TempDir& dir, int params_buffers, std::int64_t max_in_cpu) {
  StrategyConfig c = nvme_config(dir, 4096, 2, 4, false);
  c.params_buffer_count = params_buffers;
  c.max_in_cpu = max_in_cpu;
  return c;
}

}  // namespace

TEST_CASE("ZeRO-Infinity with the parameter shards on NVMe trains bit for bit like ZeRO-3, and like one process",
          "[engine][nvme]") {
  // One buffer and every shard in the file; two buffers with the first units' shards kept in
  // memory by max_in_cpu; DeepSpeed's defaults, which keep this small model's shards in memory.
  const auto [buffers, max_in_cpu] =
      GENERATE(std::pair<int, std::int64_t>{1, 0}, std::pair<int, std::int64_t>{2, 300},
               std::pair<int, std::int64_t>{5, 1'000'000'000});
  const int world = GENERATE(1, 3);
  CAPTURE(buffers, max_in_cpu, world);
  TempDir dir;
  const StrategyConfig config = parameter_config(dir, buffers, max_in_cpu);

  const AdamWConfig adamw{.lr = 1e-2};
  const auto memory = train<ZeRO3PerBlock, AdamW<float>>(world, 3, 6, adamw);
  const auto nvme = train<InfinityParametersPerBlock, AdamW<float>>(world, 3, 6, adamw, no_clip, config);
  CHECK(max_difference(nvme.parameters, memory.parameters) == 0.0);
  CHECK(nvme.losses == memory.losses);
  // Training moved the parameters, so shards read back stale or wrong would have shown.
  CHECK(max_difference(memory.parameters, train<ZeRO<3>, AdamW<float>>(world, 0, 6, adamw).parameters) > 1e-3);

  // bf16 compute with fp32 masters: the masters move with the moments, the bf16 shards apart.
  using Bf16Memory = with_t<ZeRO3PerBlock, Bf16Mixed>;
  using Bf16Nvme = with_t<InfinityParametersPerBlock, Bf16Mixed>;
  CHECK(max_difference(train<Bf16Nvme, AdamW<float>>(world, 3, 6, adamw, no_clip, config).parameters,
                       train<Bf16Memory, AdamW<float>>(world, 3, 6, adamw).parameters) == 0.0);

  // Against one process with every parameter in memory (DDP at world size 1), which shares no
  // offload code: SGD with momentum is linear in the gradients, so the ranks' split of the sums
  // changes only their rounding.
  const auto sgd = test::momentum_sgd();
  const auto one = train<DDP>(1, 3, 6, sgd);
  const auto sharded = train<InfinityParametersPerBlock>(world, 3, 6, sgd, no_clip, config);
  CHECK(max_difference(sharded.parameters, one.parameters) < 1e-5);
  CHECK(files_in(dir.path()) == 0);  // every file unlinked with its engine
}

TEST_CASE("ZeRO-Infinity with the parameter shards on NVMe: between steps only max_in_cpu's shards are in memory, "
          "and writes through access_optimizer reach the next gather",
          "[engine][nvme]") {
  constexpr int world = 2;
  TempDir dir;
  const AdamWConfig adamw{.lr = 1e-2};
  struct Seen {
    std::vector<std::int64_t> units;
    std::int64_t parameters_built = -1, parameters_between_steps = -1, optimizer_between_steps = -1;
    std::vector<bool> materialized;  // each unit's shard between steps
    std::vector<bool> in_file;
    std::size_t files_while_training = 0;
    std::vector<std::pair<std::string, std::vector<float>>> after_write;
  };
  const auto run = [&]<class S>(S, std::int64_t max_in_cpu) {
    std::vector<Seen> seen(world);
    const StrategyConfig config = parameter_config(dir, 1, max_in_cpu);
    run_ranks(world, [&](ThreadCommunicator& comm) {
      Seen& s = seen[static_cast<std::size_t>(comm.rank())];
      MemoryTracker tracker;
      TrackerScope scope(tracker);
      Gpt<float> model(test::tiny_gpt());
      Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, adamw, config, 42);
      s.parameters_built = tracker.current(MemoryCategory::Parameters);
      for (const auto& u : engine.units().units) s.units.push_back(u.padded);
      two_steps(engine, model, comm, adamw.lr);
      s.parameters_between_steps = tracker.current(MemoryCategory::Parameters);
      s.optimizer_between_steps = tracker.current(MemoryCategory::OptimizerState);
      for (const auto& u : engine.unit_states()) s.materialized.push_back(u.param_shard.storage()->materialized());
      comm.barrier();  // every rank's file exists: count them between two barriers
      s.files_while_training = files_in(dir.path());
      comm.barrier();
      // A restore of unit 1's masters, then the refresh a checkpoint load ends with: the next
      // gather reads the new values from the file.
      engine.access_optimizer(1, [&](auto&, auto params) { std::fill(params.begin(), params.end(), 0.5f); });
      engine.refresh_parameters_from_master();
      s.after_write = engine.full_parameters();
    });
    return seen;
  };
  const auto check = [&]<class S>(S strategy, std::int64_t max_in_cpu) {
    using CT = typename S::compute_type;
    CAPTURE(S::precision::name, max_in_cpu);
    const std::vector<Seen> seen = run(strategy, max_in_cpu);
    for (const Seen& s : seen) {
      const std::int64_t kept = nvme_parameters_in_memory(s.units, world, max_in_cpu);
      if (max_in_cpu > 0) {  // the root's shard, not every unit's
        CHECK(kept == s.units[0] / world);
        CHECK(kept < s.units[1] / world + s.units[0] / world);
      }
      CHECK(s.parameters_built == kept * std::int64_t(sizeof(CT)));
      CHECK(s.parameters_between_steps == kept * std::int64_t(sizeof(CT)));
      CHECK(s.optimizer_between_steps == 0);  // the masters are in the file too
      CHECK(double(s.parameters_between_steps) ==
            resident_memory<S>(std::span<const std::int64_t>(s.units), world, 2, parameter_config(dir, 1, max_in_cpu))
                .parameters);
      std::int64_t sum = 0;
      for (std::size_t i = 0; i < s.units.size(); ++i) {
        sum += s.units[i] / world;
        CHECK(s.materialized[i] == (sum <= kept));
      }
      CHECK(s.files_while_training == std::size_t(world));
      // Unit 1 is the first block: its parameters all read 0.5 now, the others did not.
      std::size_t changed = 0;
      for (const auto& [name, values] : s.after_write) {
        const bool all_half = std::all_of(values.begin(), values.end(), [](float x) { return x == 0.5f; });
        if (name.starts_with("transformer.h.0.")) CHECK(all_half);
        changed += all_half ? 1 : 0;
      }
      CHECK(changed > 0);
      CHECK(changed < s.after_write.size());
      CHECK(seen[0].after_write == s.after_write);
    }
  };
  check(InfinityParametersPerBlock{}, 0);
  check(with_t<InfinityParametersPerBlock, Bf16Mixed>{}, 0);
  // The root's shard (unit 0) fits; the first block's does not: the root alone stays.
  check(InfinityParametersPerBlock{}, 150);
  CHECK(files_in(dir.path()) == 0);
}

TEST_CASE("ZeRO-Infinity with the parameter shards on NVMe: unusable buffer settings are clear errors",
          "[engine][nvme]") {
  TempDir dir;
  const AdamWConfig adamw{.lr = 1e-2};
  StrategyConfig small = parameter_config(dir, 1, 0);
  small.params_buffer_size = 10;
  CHECK_THROWS_WITH((train<InfinityParametersPerBlock, AdamW<float>>(1, 1, 6, adamw, no_clip, small)),
                    Catch::Contains("has ") && Catch::Contains("elements, more than params_buffer_size (10)"));
  const auto train_with = [&](const StrategyConfig& c) {
    return train<InfinityParametersPerBlock, AdamW<float>>(1, 1, 6, adamw, no_clip, c);
  };
  CHECK_THROWS_WITH(train_with(parameter_config(dir, 0, 0)),
                    Catch::Contains("params_buffer_count") && Catch::Contains("at least 1, got 0"));
  CHECK_THROWS_WITH(train_with(parameter_config(dir, 1, -1)), Catch::Contains("max_in_cpu") && Catch::Contains("got -1"));
  CHECK(files_in(dir.path()) == 0);
  // Refused at the first block, once the root's shard is in the file (units go there as they are
  // built): the file goes with the engine that was not built.
  StrategyConfig root_fits = parameter_config(dir, 1, 0);
  root_fits.params_buffer_size = 200;  // the root's shard (138 elements) fits, a block's (510) does not
  CHECK_THROWS_WITH(train_with(root_fits), Catch::Contains("unit 'transformer.h.0'") &&
                                               Catch::Contains("more than params_buffer_size (200)"));
  CHECK(files_in(dir.path()) == 0);
}

TEST_CASE("ZeRO-Infinity with the parameter shards on NVMe reads the next gather's shard ahead while a unit computes",
          "[engine][nvme][memory]") {
  // Forward with four blocks: while block k computes, block k+1's gather is in flight (the
  // prefetch) and, given a free buffer, block k+2's shard is on its way in from the file. Nothing
  // is written back in forward, so the parameter memory's peak is exact either way: one block's
  // shard above the one-buffer run's, where no buffer is free for it.
  const GptConfig four_blocks{.vocab_size = 13, .block_size = 8, .n_layer = 4, .n_head = 2, .n_embd = 6};
  const auto forward_peak = [&](int buffers, std::int64_t& block_shard_bytes) {
    TempDir dir;
    std::int64_t peak = 0;
    run_ranks(1, [&](ThreadCommunicator& comm) {
      MemoryTracker tracker;
      TrackerScope scope(tracker);
      Gpt<float> model(four_blocks);
      Engine<InfinityParametersPerBlock, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(
          model, comm, AdamWConfig{}, parameter_config(dir, buffers, 0), 42);
      block_shard_bytes = engine.units().units[1].padded * std::int64_t(sizeof(float));
      const BatchSampler sampler(test::tiny_data(), 8, 2, 7);
      // A first step records the order the units run in, which the prefetch follows.
      Batch b = sampler.batch(0, 0, 1);
      engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }));
      engine.step(1e-3);
      b = sampler.batch(1, 0, 1);
      tracker.reset_peaks();
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      peak = tracker.peak(MemoryCategory::Parameters);
    });
    return peak;
  };
  std::int64_t shard = 0;
  const std::int64_t one_buffer = forward_peak(1, shard);
  const std::int64_t three_buffers = forward_peak(3, shard);
  CHECK(shard > 0);
  CHECK(three_buffers - one_buffer == shard);
}

TEST_CASE("ZeRO-Infinity: sub_group_size brings the state back a sub-group at a time and trains as in one piece",
          "[engine][nvme]") {
  const int buffers = GENERATE(4, 8);  // one or two Adam sub-groups in memory
  const int world = GENERATE(1, 3);
  CAPTURE(buffers, world);
  TempDir dir;
  StrategyConfig config = nvme_config(dir, 4096, 2, buffers, false);
  config.sub_group_size = 37;  // a block's shard is 510 elements at world size 1, 170 at 3: 14 and 5 pieces
  const AdamWConfig adamw{.lr = 1e-2};
  const auto memory = train<ZeRO3PerBlock, AdamW<float>>(world, 3, 6, adamw);
  const auto nvme = train<InfinityPerBlock, AdamW<float>>(world, 3, 6, adamw, no_clip, config);
  CHECK(max_difference(nvme.parameters, memory.parameters) == 0.0);
  CHECK(nvme.losses == memory.losses);
  // bf16: the fp32 masters come back with the moments, a sub-group at a time.
  CHECK(max_difference(train<with_t<InfinityPerBlock, Bf16Mixed>, AdamW<float>>(world, 3, 6, adamw, no_clip, config)
                           .parameters,
                       train<with_t<ZeRO3PerBlock, Bf16Mixed>, AdamW<float>>(world, 3, 6, adamw).parameters) == 0.0);
  // The parameter shards in the file too.
  StrategyConfig shards = parameter_config(dir, 1, 0);
  shards.optimizer_buffer_count = buffers;
  shards.sub_group_size = 37;
  CHECK(max_difference(train<InfinityParametersPerBlock, AdamW<float>>(world, 3, 6, adamw, no_clip, shards).parameters,
                       memory.parameters) == 0.0);
  CHECK(files_in(dir.path()) == 0);
}
