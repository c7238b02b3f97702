// The central oracle: every strategy at every world size trains to the parameters of one
// process running plain DDP.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"

using namespace polyshard;
using test::max_difference;
using test::train;

using test::DdpPerBlock;
using test::FsdpPerBlock;
using test::GradOpPerBlock;
using test::ZeRO2PerBlock;
using test::ZeRO3Checkpointed;
using Fp32Strategies = std::tuple<DDP, DdpPerBlock, ZeRO<1>, ZeRO<2>, ShardedDDP, ZeRO2PerBlock, ZeRO<3>, FSDP,
                                  FsdpPerBlock, GradOpPerBlock, ZeRO3Checkpointed>;

TEMPLATE_LIST_TEST_CASE("fp32: every strategy at world size 1 equals DDP bit for bit", "[engine]", Fp32Strategies) {
  const auto reference = train<DDP>(1);
  const auto result = train<TestType>(1);
  CHECK(max_difference(result.parameters, reference.parameters) == 0.0);
  CHECK(result.losses == reference.losses);
}

TEST_CASE("a composition spelled two ways is one engine, its strategy as each spelled it", "[engine]") {
  // FsdpPerBlock with its policies in another order and a default written out.
  using Respelled = Strategy<WrapByType<Block>, Fp32, ShardParameters<true>>;
  using Shared = detail::EngineOver<canonical_t<FsdpPerBlock>, Gpt<float>, ThreadCommunicator, Sgd<float>>;
  using A = Engine<FsdpPerBlock, Gpt<float>, ThreadCommunicator, Sgd<float>>;
  using B = Engine<Respelled, Gpt<float>, ThreadCommunicator, Sgd<float>>;
  STATIC_REQUIRE(std::is_base_of_v<Shared, A>);
  STATIC_REQUIRE(std::is_base_of_v<Shared, B>);
  STATIC_REQUIRE(std::is_same_v<A::strategy, FsdpPerBlock>);
  STATIC_REQUIRE(std::is_same_v<B::strategy, Respelled>);
  STATIC_REQUIRE(sizeof(A) == sizeof(Shared));
}

TEMPLATE_LIST_TEST_CASE("fp32: every strategy at world sizes 2, 3, 4 trains like one process", "[engine]",
                        Fp32Strategies) {
  const auto reference = train<DDP>(1);
  const int world = GENERATE(2, 3, 4);
  CAPTURE(world);
  const auto result = train<TestType>(world);
  // Only the order of floating-point sums differs from one process.
  CHECK(max_difference(result.parameters, reference.parameters) < 1e-6);
  for (std::size_t i = 0; i < reference.losses.size(); ++i) CHECK(result.losses[i] == Approx(reference.losses[i]).epsilon(1e-6));
  // And training did move the parameters.
  CHECK(max_difference(result.parameters, train<DDP>(1, 0).parameters) > 1e-3);
}

TEST_CASE("fp32: the sharded stages agree with each other bit for bit at the same world size", "[engine]") {
  const int world = GENERATE(2, 3);
  const auto zero1 = train<ZeRO<1>>(world);
  CHECK(max_difference(train<ZeRO<2>>(world).parameters, zero1.parameters) == 0.0);
  CHECK(max_difference(train<ZeRO<3>>(world).parameters, zero1.parameters) == 0.0);
}

TEST_CASE("AdamW: sharded runs stay within a small fraction of one update of one process", "[engine]") {
  const AdamWConfig adamw{.lr = 1e-2};
  const auto reference = train<DDP, AdamW<float>>(1, 3, 6, adamw);
  for (int world : {2, 4}) {
    CHECK(max_difference(train<ZeRO<3>, AdamW<float>>(world, 3, 6, adamw).parameters, reference.parameters) < 0.01 * adamw.lr);
    CHECK(max_difference(train<ZeRO<1>, AdamW<float>>(world, 3, 6, adamw).parameters, reference.parameters) < 0.01 * adamw.lr);
  }
}

TEST_CASE("gradient clipping equals clipping the unsharded gradient", "[engine]") {
  const auto reference = train<DDP>(1, 3, 6, test::momentum_sgd(), 0.05);
  const auto unclipped = train<DDP>(1, 3, 6, test::momentum_sgd());
  CHECK(max_difference(reference.parameters, unclipped.parameters) > 1e-3);  // clipping did bite
  for (int world : {2, 3}) {
    CHECK(max_difference(train<ZeRO<3>>(world, 3, 6, test::momentum_sgd(), 0.05).parameters, reference.parameters) < 1e-6);
    CHECK(max_difference(train<ZeRO<1>>(world, 3, 6, test::momentum_sgd(), 0.05).parameters, reference.parameters) < 1e-6);
    CHECK(max_difference(train<DDP>(world, 3, 6, test::momentum_sgd(), 0.05).parameters, reference.parameters) < 1e-6);
  }
}

TEST_CASE("hybrid sharding: shard within groups, replicate across them, train like one process", "[engine]") {
  const auto reference = train<DDP>(1);
  using Hybrid2 = Strategy<HybridShard<ShardGradients>>;
  using Hybrid3 = Strategy<HybridShard<ShardParameters<true>>, WrapByType<Block>>;
  using Hybrid1 = Strategy<HybridShard<ShardOptimizerState>>;
  for (auto [world, group] : {std::pair{4, 2}, std::pair{4, 1}, std::pair{2, 2}, std::pair{6, 3}}) {
    CAPTURE(world, group);
    StrategyConfig config;
    config.hybrid_group_size = group;
    const auto sgd = test::momentum_sgd();
    const auto inf = std::numeric_limits<double>::infinity();
    const auto h2 = train<Hybrid2>(world, 3, 6, sgd, inf, config);
    const auto h3 = train<Hybrid3>(world, 3, 6, sgd, inf, config);
    const auto h1 = train<Hybrid1>(world, 3, 6, sgd, inf, config);
    CHECK(max_difference(h2.parameters, reference.parameters) < 1e-6);
    CHECK(max_difference(h3.parameters, reference.parameters) < 1e-6);
    CHECK(max_difference(h1.parameters, reference.parameters) < 1e-6);
    // FairScale's partition within each group: the same shards in every group, all-reduced across.
    StrategyConfig whole = config;
    whole.partition = ShardPartition::whole_parameters;
    const auto hw = train<Hybrid2>(world, 3, 6, sgd, inf, whole);
    CHECK(max_difference(hw.parameters, reference.parameters) < 1e-6);
    if (group > 1) {
      // Each owner's reduction and broadcast sent whole in the group, then the rank's own shard
      // all-reduced across the groups, by a formula written here: P (4 + 4) + 2 (R-1)/R s 4.
      REQUIRE(hw.rank_shard >= 0);
      const double replicas = double(world / group), p = double(hw.padded), s = double(hw.rank_shard);
      const double hw_formula = 8.0 * p + 2.0 * (replicas - 1) / replicas * s * 4;
      CHECK(hw.bytes_sent == Approx(hw_formula).epsilon(1e-12));
      CHECK(bytes_sent_per_step<Hybrid2>(hw.padded, hw.root_padded, world, false, group, hw.rank_shard) ==
            Approx(hw_formula));
    }
    // Traffic: the inner strategy within a group, plus an all-reduce of each shard across groups.
    const double h2_per_rank = bytes_sent_per_step<Hybrid2>(h2.padded, h2.root_padded, world, false, group);
    const double h3_per_rank = bytes_sent_per_step<Hybrid3>(h3.padded, h3.root_padded, world, false, group);
    CHECK(h2.bytes_sent == Approx(h2_per_rank));
    CHECK(h3.bytes_sent == Approx(h3_per_rank));
    // Model state is that of the inner strategy on a group.
    CHECK(double(h3.model_state) == Approx(model_state_bytes<Hybrid3>(h3.padded, group, 1)));
    // The traffic the in-process backend measured as it copied, over the shard groups and the
    // replicas alike (Engine::traffic()), summed over the ranks: each kind what the ring formula
    // predicts, and all of it the hybrid formula's, so that no communicator goes uncounted.
    const std::pair<const test::RunResult*, double> hybrids[] = {
        {&h2, h2_per_rank},
        {&h3, h3_per_rank},
        {&h1, bytes_sent_per_step<Hybrid1>(h1.padded, h1.root_padded, world, false, group)}};
    for (const auto& [h, per_rank] : hybrids) {
      double moved = 0;
      for (const auto& [kind, bytes] : h->traffic) {
        INFO("collective kind " << static_cast<int>(kind));
        CHECK(bytes.first == Approx(bytes.second).margin(1e-9));
        moved += bytes.first;
      }
      CHECK(moved == Approx(world * per_rank).margin(1e-9));
      if (world / group > 1) CHECK(h->traffic.at(CollectiveKind::AllReduce).first > 0);  // the replicas'
    }
  }
  StrategyConfig bad;
  bad.hybrid_group_size = 3;
  CHECK_THROWS_WITH(train<Hybrid2>(4, 1, 6, test::momentum_sgd(), std::numeric_limits<double>::infinity(), bad),
                    Catch::Contains("not a multiple of hybrid_group_size 3"));
  // The engine refuses a field no strategy reads (policy/config.hpp), on every rank.
  StrategyConfig unread;
  unread.params_buffer_count = 2;
  CHECK_THROWS_WITH(train<Hybrid2>(2, 1, 6, test::momentum_sgd(), std::numeric_limits<double>::infinity(), unread),
                    Catch::Contains("params_buffer_count (2)"));
  // And one this composition does not read: HybridShard<ShardGradients> gathers nothing ahead.
  StrategyConfig not_prefetched;
  not_prefetched.prefetch = false;
  CHECK_THROWS_WITH(
      train<Hybrid2>(2, 1, 6, test::momentum_sgd(), std::numeric_limits<double>::infinity(), not_prefetched),
      Catch::Contains("prefetch = false is read only by ShardParameters"));
}
