// The policy lattice's predicate and covering subset (tests/support/policy_lattice.hpp): the
// counts follow from the families' rules, every composition the predicate calls valid compiles
// as the engine instantiates it (the other direction, invalid ones failing with the predicate's
// sentence, is checked on samples by tests/fail/lattice), and the subset covers every pair.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "polyshard/engine/offload.hpp"
#include "support/policy_covering.hpp"

using namespace polyshard;
namespace lattice = polyshard::test::lattice;

namespace {

/// Instantiates Strategy and the offload placement (what Engine instantiates of a composition
/// before its model) for every composition the predicate calls valid: one that does not compile
/// stops this file's compilation with its static_assert.
template <std::size_t... K>
constexpr std::size_t instantiate_valid(std::index_sequence<K...>) {
  return (std::size_t{0} + ... + [] {
    if constexpr (lattice::composition<K>::valid) {
      using S = lattice::strategy_t<K>;
      static_assert(sizeof(S) > 0 && sizeof(OffloadPlacement<typename S::offload>) > 0);
      return std::size_t{1};
    } else {
      return std::size_t{0};
    }
  }());
}

}  // namespace

TEST_CASE("lattice: every composition the predicate calls valid compiles as the engine instantiates it", "[policy][lattice]") {
  STATIC_REQUIRE(instantiate_valid(std::make_index_sequence<lattice::kCompositions>()) == lattice::kValid);
}

TEST_CASE("lattice: the number of valid compositions follows from the families' rules", "[policy][lattice]") {
  // 10 sharding members (five policies, HybridShard over each), 6 offload, 4 precision, 4 wrap, 2
  // activation checkpointing.
  CHECK(lattice::kCompositions == 10 * 6 * 4 * 4 * 2);
  // HybridShard<NoShard> is never valid. NoShard admits NoOffload only; the optimizer and gradient
  // sharding policies (plain and hybrid: 4) admit NoOffload and OffloadOptimizer<Cpu>; the
  // parameter sharding ones (4) admit every offload, the two to NVMe only where liburing was
  // found. Precision, wrap and checkpointing combine freely.
  const std::size_t nvme = lattice::kHaveLiburing ? 2 : 0;
  CHECK(lattice::kValid == (1 + 4 * 2 + 4 * (4 + nvme)) * 4 * 4 * 2);
  // Each sentence of the predicate stands for a rule: count the compositions each one rejects.
  std::map<std::string_view, std::size_t> rejected;
  for (const std::string_view e : lattice::kErrors)
    if (!e.empty()) ++rejected[e];
  CHECK(rejected["HybridShard<NoShard> shards nothing within a group: use NoShard (DDP) instead"] == 6 * 4 * 4 * 2);
  // NoShard and ShardOptimizerState/ShardGradients (plain and hybrid) with OffloadParameters<Cpu>,
  // OffloadParameters<Nvme> or OffloadParametersOnly<Cpu>: 5 * 3.
  CHECK(rejected["offloading parameters needs ShardParameters"] == 5 * 3 * 4 * 4 * 2);
  CHECK(rejected["offloading the optimizer needs a sharded optimizer"] == 1 * 2 * 4 * 4 * 2);  // NoShard, OffloadOptimizer
  CHECK(rejected["offloading to NVMe needs ShardParameters"] == 4 * 1 * 4 * 4 * 2);  // sharded optimizer, OffloadOptimizer<Nvme>
  if (!lattice::kHaveLiburing) {  // the parameter sharding policies (4) with either offload to NVMe
    CHECK(rejected["OffloadOptimizer<Nvme> (ZeRO-Infinity) needs liburing"] == 4 * 1 * 4 * 4 * 2);
    CHECK(rejected["OffloadParameters<Nvme> (ZeRO-Infinity) needs liburing"] == 4 * 1 * 4 * 4 * 2);
  }
}

TEST_CASE("lattice: the covering subset trains every pair of members of two families together", "[policy][lattice]") {
  // Checked here by brute force over the members, independently of the generator's bookkeeping.
  const auto& cover = lattice::kCovering;
  std::set<std::size_t> distinct(cover.picks.begin(), cover.picks.begin() + std::ptrdiff_t(cover.size));
  CHECK(distinct.size() == cover.size);
  for (std::size_t i = 0; i < cover.size; ++i) CHECK(lattice::kErrors[cover.picks[i]].empty());
  std::size_t coverable = 0;
  for (std::size_t f = 0; f < lattice::kFamilies; ++f)
    for (std::size_t g = f + 1; g < lattice::kFamilies; ++g)
      for (std::size_t a = 0; a < lattice::kSizes[f]; ++a)
        for (std::size_t b = 0; b < lattice::kSizes[g]; ++b) {
          auto holds = [&](std::size_t k) {
            const auto m = lattice::members_of(k);
            return m[f] == a && m[g] == b;
          };
          bool some_valid = false;
          for (std::size_t k = 0; k < lattice::kCompositions; ++k) some_valid |= lattice::kErrors[k].empty() && holds(k);
          bool covered = false;
          for (std::size_t i = 0; i < cover.size; ++i) covered |= holds(cover.picks[i]);
          INFO(lattice::kFamilyNames[f] << " member " << a << " with " << lattice::kFamilyNames[g] << " member " << b);
          CHECK(covered == some_valid);
          coverable += some_valid;
        }
  CHECK(coverable == cover.coverable_pairs);
  // No subset is smaller than the largest product of two families' valid members: 9 sharding
  // members that train, times 4 precisions (or 4 wraps) = 36.
  CHECK(cover.size >= 36);
  CHECK(cover.size <= 47);  // the greedy generator stays near that bound (46 with both NVMe offloads)
}
