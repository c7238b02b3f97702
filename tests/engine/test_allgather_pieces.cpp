// allgather_bucket_size where the parameters are whole and the optimizer sharded (ZeRO-1,
// ZeRO-2, as DeepSpeed's stages 1 and 2 read it): the updated shards are all-gathered after the
// step in pieces of allgather_bucket_size / N elements of each shard, to the bits and the bytes
// of one all-gather a unit.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"
#include "expected_layout.hpp"

using namespace polyshard;

namespace {

StrategyConfig allgather_bucket(std::int64_t elements) {
  StrategyConfig c;
  c.allgather_bucket_size = elements;
  return c;
}

/// ceil(a / b), written out here rather than taken from the code under test.
std::int64_t pieces(std::int64_t shard, std::int64_t piece) { return (shard + piece - 1) / piece; }

/// The compositions whose parameters are whole and whose updated shards are all-gathered.
using UpdatedShardsGathered =
    std::tuple<ZeRO<1>, ZeRO<2>, Strategy<ShardGradients, WrapByType<Block>>, Strategy<ShardGradients, Bf16Mixed>,
               Strategy<ShardOptimizerState, OffloadOptimizer<Cpu>>, Strategy<HybridShard<ShardGradients>>>;

}  // namespace

TEST_CASE("allgather_piece_elements: each shard's share of allgather_bucket_size, at least one element, 0 for the "
          "whole shard",
          "[engine][policy]") {
  CHECK(allgather_piece_elements(allgather_bucket(10), 3, 100) == 3);
  CHECK(allgather_piece_elements(allgather_bucket(2), 3, 100) == 1);  // never less than an element a rank
  CHECK(allgather_piece_elements(allgather_bucket(299), 3, 100) == 99);
  CHECK(allgather_piece_elements(allgather_bucket(300), 3, 100) == 0);  // the whole shard at once
  // Lightning's default of 2e8 cuts only units of more than 2e8 elements.
  CHECK(allgather_piece_elements({}, 8, 25'000'000) == 0);
  CHECK(allgather_piece_elements({}, 8, 25'000'001) == 25'000'000);
}

TEMPLATE_LIST_TEST_CASE("allgather_bucket_size cuts the all-gather of the updated shards into pieces, to the bits and "
                        "bytes of one a unit",
                        "[engine]", UpdatedShardsGathered) {
  using S = TestType;
  constexpr double no_clip = std::numeric_limits<double>::infinity();
  for (const int world : {2, 3}) {
    CAPTURE(world);
    const auto whole = test::train<S>(world, 3, 6, test::momentum_sgd(), no_clip, {});
    const auto cut = test::train<S>(world, 3, 6, test::momentum_sgd(), no_clip, allgather_bucket(5 * world));
    CHECK(cut.parameters == whole.parameters);
    CHECK(cut.losses == whole.losses);
    // One all-gather a unit on each rank, against one per 5 elements of its shard (the units'
    // padded sizes from the shapes: expected_layout.hpp); the ring moves the same bytes.
    const std::vector<std::int64_t> units = test::padded_units<S>(test::gpt_shapes(test::tiny_gpt()), world);
    std::int64_t expected = 0;
    for (const std::int64_t padded : units) expected += pieces(padded / world, 5);
    CHECK(whole.calls.at(CollectiveKind::AllGather) == world * units.size());
    CHECK(cut.calls.at(CollectiveKind::AllGather) == std::uint64_t(world * expected));
    CHECK(cut.traffic.at(CollectiveKind::AllGather) == whole.traffic.at(CollectiveKind::AllGather));
  }
  // The pieces are placed where each rank's shard goes: training moved the parameters.
  CHECK(test::max_difference(test::train<S>(2, 3, 6).parameters, test::train<S>(2, 0, 6).parameters) > 1e-3);
}
