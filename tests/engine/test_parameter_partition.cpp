// ShardPartition::whole_parameters, FairScale OSS's partition: its rule on sequences worked out by
// hand, the layout it gives a model checked against a tally kept here, and the ShardedDDP preset,
// which uses it, training as one process.
#include <catch2/catch.hpp>

#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine_fixture.hpp"
#include "polyshard/engine/parameter_partition.hpp"

using namespace polyshard;
using test::max_difference;
using test::train;

TEST_CASE("whole parameters go, in order, to the rank holding the fewest elements, as OSS assigns them",
          "[engine][partition]") {
  struct Row {
    std::vector<std::int64_t> numels;
    std::vector<bool> trainable;
    int world;
    std::vector<int> owners;
  };
  // By hand: the loads before each parameter, then the rank with the least (the lowest on a tie).
  const std::vector<Row> rows{
      // [0 0] -> 0: [10 0] -> 1: [10 3] -> 1: [10 6] -> 1: [10 9] -> 1: [10 17]
      {{10, 3, 3, 3, 8}, {true, true, true, true, true}, 2, {0, 1, 1, 1, 1}},
      // A frozen parameter counts one element: [0 0 0] -> 0: [5 0 0] -> 1 (frozen): [5 1 0] -> 2:
      // [5 1 5] -> 1: [5 2 5] -> 1: [5 4 5]
      {{5, 5, 5, 1, 2}, {true, false, true, true, true}, 3, {0, 1, 2, 1, 1}},
      // Ties go to the lowest rank; an empty parameter adds nothing: [0 0] -> 0 (0 elements) -> 0:
      // [7 0] -> 1: [7 4] -> 1: [7 8] -> 0
      {{0, 7, 4, 4, 1}, {true, true, true, true, true}, 2, {0, 0, 1, 1, 0}},
      // One rank holds everything.
      {{3, 1, 2}, {true, false, true}, 1, {0, 0, 0}},
  };
  for (const Row& row : rows) {
    std::vector<std::int64_t> load(static_cast<std::size_t>(row.world), 0);
    CHECK(assign_whole_parameters(row.numels, row.trainable, load) == row.owners);
  }
  // The tally runs on from one call (a unit) to the next: [4 4] -> 0, then [5 4] -> 1.
  std::vector<std::int64_t> load{0, 0};
  CHECK(assign_whole_parameters({4, 4}, {true, true}, load) == std::vector<int>{0, 1});
  CHECK(assign_whole_parameters({1, 6}, {true, true}, load) == std::vector<int>{0, 1});
  CHECK(load == std::vector<std::int64_t>{5, 10});
  CHECK_THROWS_WITH(assign_whole_parameters({1}, {true, false}, load), Catch::Contains("1 parameter sizes for 2"));
}

namespace {

/// One parameter's place in an engine's layout, copied out of the rank that built it.
struct Placed {
  std::size_t unit;
  std::int64_t offset, numel, shard;
};

/// Rank 0's layout under S on `world` thread ranks, by parameter name, and its partition setting;
/// `frozen` names parameters frozen before the engine is built.
template <class S>
std::pair<std::map<std::string, Placed>, std::optional<ShardPartition>> layout_of(
    int world, const std::set<std::string>& frozen = {}) {
  std::map<std::string, Placed> out;
  std::optional<ShardPartition> partition;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    visit_parameters(model, [&](const std::string& name, Parameter<float>& p) {
      if (frozen.count(name)) p.set_requires_grad(false);
    });
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    if (comm.rank() != 0) return;
    partition = engine.config().partition;
    const auto& units = engine.units().units;
    for (std::size_t u = 0; u < units.size(); ++u)
      for (const auto& e : units[u].entries) out[e.name] = {u, e.offset, e.numel(), units[u].padded / world};
  });
  return {out, partition};
}

}  // namespace

TEST_CASE("under whole_parameters each rank's shard holds whole parameters, those OSS's tally gives it, in the "
          "model's order, and is as long as the largest rank's",
          "[engine][partition]") {
  using PerBlock = Strategy<ShardGradients, WrapByType<Block>, FairScaleShardedDefaults>;
  const int world = GENERATE(2, 3, 4);
  const bool with_frozen = GENERATE(false, true);
  CAPTURE(world, with_frozen);
  const std::set<std::string> frozen =
      with_frozen ? std::set<std::string>{"transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight"}
                  : std::set<std::string>{};
  CHECK(layout_of<ZeRO<2>>(world).second == ShardPartition::flat_slices);
  for (const bool per_block : {false, true}) {
    INFO("units: " << (per_block ? "one a block" : "the whole model"));
    const auto layout = per_block ? layout_of<PerBlock>(world, frozen) : layout_of<ShardedDDP>(world, frozen);
    const std::map<std::string, Placed>& whole = layout.first;
    CHECK(layout.second == ShardPartition::whole_parameters);
    // The tally, kept here over the model's parameters in the order it declares them (the order
    // its visitor walks, which is no engine's), and each rank's next free element per unit.
    Gpt<float> model(test::tiny_gpt());
    std::vector<std::int64_t> load(static_cast<std::size_t>(world), 0);
    std::map<std::pair<std::size_t, int>, std::int64_t> next;
    std::map<std::size_t, std::vector<std::int64_t>> held;
    std::size_t visited = 0;
    visit_parameters(model, [&](const std::string& name, Parameter<float>& p) {
      INFO(name);
      ++visited;
      REQUIRE(whole.count(name) == 1);
      const Placed& at = whole.at(name);
      int owner = 0;
      for (int r = 1; r < world; ++r)
        if (load[static_cast<std::size_t>(r)] < load[static_cast<std::size_t>(owner)]) owner = r;
      load[static_cast<std::size_t>(owner)] += frozen.count(name) ? 1 : p.numel();
      // Whole in the owner's shard, right after the owner's earlier parameters of the unit.
      auto [slot, fresh] = next.try_emplace({at.unit, owner}, owner * at.shard);
      CHECK(at.offset == slot->second);
      CHECK(at.offset + at.numel <= (owner + 1) * at.shard);
      slot->second += at.numel;
      auto& unit_held = held.try_emplace(at.unit, std::vector<std::int64_t>(static_cast<std::size_t>(world), 0)).first->second;
      unit_held[static_cast<std::size_t>(owner)] += at.numel;
    });
    CHECK(visited == whole.size());
    CHECK(held.size() == (per_block ? 3u : 1u));  // tiny_gpt has two blocks
    for (const auto& [unit, per_rank] : held) {
      INFO("unit " << unit);
      const auto largest = *std::max_element(per_rank.begin(), per_rank.end());
      for (const auto& [name, at] : whole)
        if (at.unit == unit) CHECK(at.shard == largest);
    }
  }
}

TEST_CASE("the ShardedDDP preset partitions as FairScale's OSS, and a partition set replaces it", "[engine][partition]") {
  CHECK(with_reference_defaults<ShardedDDP>({}).partition == ShardPartition::whole_parameters);
  CHECK(with_reference_defaults<ZeRO<1>>({}).partition == ShardPartition::flat_slices);
  CHECK(with_reference_defaults<ZeRO<2>>({}).partition == ShardPartition::flat_slices);
  CHECK(with_reference_defaults<Strategy<ShardGradients>>({}).partition == ShardPartition::flat_slices);
  CHECK_FALSE(with_reference_defaults<DDP>({}).partition.has_value());  // nothing to partition
  CHECK_FALSE(with_reference_defaults<ZeRO<3>>({}).partition.has_value());
  StrategyConfig flat;
  flat.partition = ShardPartition::flat_slices;
  CHECK(with_reference_defaults<ShardedDDP>(flat).partition == ShardPartition::flat_slices);
  StrategyConfig whole;
  whole.partition = ShardPartition::whole_parameters;
  CHECK(with_reference_defaults<ZeRO<1>>(whole).partition == ShardPartition::whole_parameters);
}

TEST_CASE("whole_parameters trains as one process, with ShardGradients and ShardOptimizerState, and as the flat "
          "slices do",
          "[engine][partition]") {
  const auto reference = train<DDP>(1);
  StrategyConfig whole;
  whole.partition = ShardPartition::whole_parameters;
  const auto inf = std::numeric_limits<double>::infinity();
  for (const int world : {2, 3}) {
    INFO("world size " << world);
    const auto sharded = train<ShardedDDP>(world);
    CHECK(max_difference(sharded.parameters, reference.parameters) < 1e-6);
    // Memory and traffic are the accounting's formulas over the padded layout (the layout itself
    // is checked against a tally above). SGD with momentum keeps one state value per parameter.
    CHECK(double(sharded.model_state) == Approx(model_state_bytes<ShardedDDP>(sharded.padded, world, 1)).epsilon(1e-12));
    CHECK(sharded.bytes_sent ==
          Approx(bytes_sent_per_step<ShardedDDP>(sharded.padded, sharded.root_padded, world)).epsilon(1e-12));
    for (std::size_t i = 0; i < reference.losses.size(); ++i)
      CHECK(sharded.losses[i] == Approx(reference.losses[i]).epsilon(1e-6));
    const auto zero1 = train<ZeRO<1>>(world, 3, 6, test::momentum_sgd(), inf, whole);
    CHECK(max_difference(zero1.parameters, reference.parameters) < 1e-6);
    // Clipped: the global norm sums the shards, padding between the parameters included (zero).
    const auto clipped = train<ShardedDDP>(world, 3, 6, test::momentum_sgd(), 0.5);
    CHECK(max_difference(clipped.parameters, train<DDP>(1, 3, 6, test::momentum_sgd(), 0.5).parameters) < 1e-6);
    // The updates are elementwise, so only where each element is updated differs from the flat
    // slices: bit for bit the same parameters.
    CHECK(max_difference(sharded.parameters, train<ZeRO<2>>(world).parameters) == 0.0);
  }
}

TEST_CASE("whole_parameters is refused where the parameters are sharded or nothing is, naming the policy",
          "[engine][partition]") {
  StrategyConfig whole;
  whole.partition = ShardPartition::whole_parameters;
  CHECK_THROWS_WITH((refuse_fields_not_read_by<FSDP>(whole)),
                    Catch::Contains("StrategyConfig::partition = whole_parameters") &&
                        Catch::Contains("ShardParameters, whose parameter shards are even slices"));
  CHECK_THROWS_WITH((refuse_fields_not_read_by<DDP>(whole)), Catch::Contains("NoShard, which partitions nothing"));
  CHECK_NOTHROW(refuse_fields_not_read_by<ZeRO<1>>(whole));
  CHECK_NOTHROW(refuse_fields_not_read_by<Strategy<HybridShard<ShardGradients>>>(whole));
  StrategyConfig flat;
  flat.partition = ShardPartition::flat_slices;  // what they do: accepted
  CHECK_NOTHROW(refuse_fields_not_read_by<FSDP>(flat));
  CHECK_NOTHROW(refuse_fields_not_read_by<DDP>(flat));
}
