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
  std::int64_t offset, numel;
};

/// Rank 0's view of an engine's layout: each parameter by name, each unit's shard bounds and
/// padded size, and the partition setting.
struct Layout {
  std::map<std::string, Placed> parameters;
  std::vector<std::vector<std::int64_t>> bounds;
  std::vector<std::int64_t> padded;
  std::optional<ShardPartition> partition;
};

/// The layout under S on `world` thread ranks; `frozen` names parameters frozen before the
/// engine is built.
template <class S>
Layout layout_of(int world, const std::set<std::string>& frozen = {}) {
  Layout out;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    visit_parameters(model, [&](const std::string& name, Parameter<float>& p) {
      if (frozen.count(name)) p.set_requires_grad(false);
    });
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    if (comm.rank() != 0) return;
    out.partition = engine.config().partition;
    const auto& units = engine.units().units;
    for (std::size_t u = 0; u < units.size(); ++u) {
      out.bounds.push_back(units[u].bounds);
      out.padded.push_back(units[u].padded);
      for (const auto& e : units[u].entries) out.parameters[e.name] = {u, e.offset, e.numel()};
    }
  });
  return out;
}

}  // namespace

TEST_CASE("under whole_parameters each rank's shard holds the whole parameters OSS's tally gives it, in the "
          "model's order, and nothing else",
          "[engine][partition]") {
  using PerBlock = Strategy<ShardGradients, WrapByType<Block>, FairScaleShardedDefaults>;
  const int world = GENERATE(2, 3, 4);
  const bool with_frozen = GENERATE(false, true);
  CAPTURE(world, with_frozen);
  const std::set<std::string> frozen =
      with_frozen ? std::set<std::string>{"transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight"}
                  : std::set<std::string>{};
  const Layout flat = layout_of<ZeRO<2>>(world);
  CHECK(flat.partition == ShardPartition::flat_slices);
  for (const auto& b : flat.bounds) CHECK(b.empty());  // equal shards
  for (const bool per_block : {false, true}) {
    INFO("units: " << (per_block ? "one a block" : "the whole model"));
    const Layout whole = per_block ? layout_of<PerBlock>(world, frozen) : layout_of<ShardedDDP>(world, frozen);
    CHECK(whole.partition == ShardPartition::whole_parameters);
    REQUIRE(whole.bounds.size() == (per_block ? 3u : 1u));  // tiny_gpt has two blocks
    // The tally, kept here over the model's parameters in the order it declares them (the order
    // its visitor walks, which is no engine's), and each rank's next free element per unit.
    Gpt<float> model(test::tiny_gpt());
    std::vector<std::int64_t> load(static_cast<std::size_t>(world), 0);
    std::map<std::pair<std::size_t, int>, std::int64_t> next;
    std::size_t visited = 0;
    visit_parameters(model, [&](const std::string& name, Parameter<float>& p) {
      INFO(name);
      ++visited;
      REQUIRE(whole.parameters.count(name) == 1);
      const Placed& at = whole.parameters.at(name);
      const std::vector<std::int64_t>& bounds = whole.bounds[at.unit];
      REQUIRE(bounds.size() == static_cast<std::size_t>(world) + 1);
      int owner = 0;
      for (int r = 1; r < world; ++r)
        if (load[static_cast<std::size_t>(r)] < load[static_cast<std::size_t>(owner)]) owner = r;
      load[static_cast<std::size_t>(owner)] += frozen.count(name) ? 1 : p.numel();
      // Whole in the owner's shard, right after the owner's earlier parameters of the unit.
      auto slot = next.try_emplace({at.unit, owner}, bounds[static_cast<std::size_t>(owner)]).first;
      CHECK(at.offset == slot->second);
      slot->second += at.numel;
      CHECK(slot->second <= bounds[static_cast<std::size_t>(owner) + 1]);
    });
    CHECK(visited == whole.parameters.size());
    // Each shard ends where its rank's last parameter does: no padding, and the unit is its
    // parameters.
    for (std::size_t u = 0; u < whole.bounds.size(); ++u) {
      INFO("unit " << u);
      const std::vector<std::int64_t>& bounds = whole.bounds[u];
      CHECK(bounds.front() == 0);
      CHECK(bounds.back() == whole.padded[u]);
      for (std::size_t r = 0; r < bounds.size() - 1; ++r) {
        const auto it = next.find({u, static_cast<int>(r)});
        CHECK(bounds[r + 1] == (it == next.end() ? bounds[r] : it->second));
      }
    }
  }
}

TEST_CASE("the ShardedDDP preset partitions as FairScale's OSS, and a partition set replaces it",
          "[engine][partition]") {
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
    // Memory and traffic are the accounting's formulas over the rank's own shard (the layout
    // itself is checked against a tally above): whole parameters, and the shard's gradients and
    // state (SGD with momentum: one value per parameter); every unit reduced to and broadcast
    // from each owner, which a ring sends whole.
    REQUIRE(sharded.rank_shard >= 0);
    const double state = 4.0 * double(sharded.padded) + (4.0 + 4.0) * double(sharded.rank_shard);
    CHECK(double(sharded.model_state) == Approx(state).epsilon(1e-12));
    CHECK(model_state_bytes<ShardedDDP>(sharded.padded, world, 1, sharded.rank_shard) == Approx(state));
    CHECK(sharded.bytes_sent == Approx(8.0 * double(sharded.padded)).epsilon(1e-12));
    CHECK(bytes_sent_per_step<ShardedDDP>(sharded.padded, sharded.root_padded, world, false, 0, sharded.rank_shard) ==
          Approx(8.0 * double(sharded.padded)));
    for (std::size_t i = 0; i < reference.losses.size(); ++i)
      CHECK(sharded.losses[i] == Approx(reference.losses[i]).epsilon(1e-6));
    const auto zero1 = train<ZeRO<1>>(world, 3, 6, test::momentum_sgd(), inf, whole);
    CHECK(max_difference(zero1.parameters, reference.parameters) < 1e-6);
    // Clipped: the global norm sums every rank's shard, each of its own size.
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
  StrategyConfig cut = whole;  // no all-gather to cut: each rank's shard is broadcast from it
  cut.allgather_bucket_size = 10;
  CHECK_THROWS_WITH(refuse_fields_not_read_by<ZeRO<1>>(cut), Catch::Contains("allgather_bucket_size = 10") &&
                                                                  Catch::Contains("partition = whole_parameters"));
  CHECK_NOTHROW(refuse_fields_not_read_by<Strategy<HybridShard<ShardGradients>>>(whole));
  StrategyConfig flat;
  flat.partition = ShardPartition::flat_slices;  // what they do: accepted
  CHECK_NOTHROW(refuse_fields_not_read_by<FSDP>(flat));
  CHECK_NOTHROW(refuse_fields_not_read_by<DDP>(flat));
}
