// The covering subset of the policy lattice (tests/support/policy_lattice.hpp) trained against
// the oracle at world sizes 1 to 8: every pair of members of two families is trained together at
// least once, on a model whose units pad at every world size. Compiled in parts (one
// translation unit per part, POLYSHARD_LATTICE_PART of POLYSHARD_LATTICE_PARTS) so that the
// engines the subset instantiates build in parallel.
#include <catch2/catch.hpp>

#include "io/temp_dir.hpp"
#include "oracle_fixture.hpp"
#include "support/policy_covering.hpp"

#if !defined(POLYSHARD_LATTICE_PART) || !defined(POLYSHARD_LATTICE_PARTS)
#error "test_lattice.hpp: define POLYSHARD_LATTICE_PART and POLYSHARD_LATTICE_PARTS (tests/engine/CMakeLists.txt does)"
#endif

using namespace polyshard;
using namespace polyshard::test::oracle;
namespace lattice = polyshard::test::lattice;

namespace {

constexpr std::size_t kFirst = lattice::kCovering.size * POLYSHARD_LATTICE_PART / POLYSHARD_LATTICE_PARTS;
constexpr std::size_t kLast = lattice::kCovering.size * (POLYSHARD_LATTICE_PART + 1) / POLYSHARD_LATTICE_PARTS;
using ThisPart = lattice::covering_slice_t<kFirst, kLast>;

/// HybridShard's groups at world size W: two groups of W / 2 ranks where W is even (at W = 2, two
/// groups of one rank: replication only), one group of W ranks where it is odd.
int hybrid_group_size(int world) { return world % 2 == 0 ? world / 2 : world; }

}  // namespace

#define POLYSHARD_STRINGIFY_(x) #x
#define POLYSHARD_STRINGIFY(x) POLYSHARD_STRINGIFY_(x)

TEMPLATE_LIST_TEST_CASE("lattice: the covering subset trains as one double-precision process at world sizes 1 to 8 "
                        "(part " POLYSHARD_STRINGIFY(POLYSHARD_LATTICE_PART) ")",
                        "[engine][oracle][lattice]", ThisPart) {
  constexpr std::size_t K = TestType::value;
  using S = lattice::strategy_t<K>;
  using P = typename S::precision;
  INFO(lattice::composition_name<K>());
  const SgdConfig sgd = test::momentum_sgd();
  constexpr double no_clip = std::numeric_limits<double>::infinity();
  using Opt = Sgd<typename P::master_type>;
  const Expected expected = train_reference<P>(sgd, sgd.lr, no_clip);
  REQUIRE_FALSE(expected.overflowed);  // the engine would skip that step, the oracle does not
  // The runtime options under hybrid sharding, as the oracle runs them: clipping at a norm below
  // every step's (the global norm over every group's shards, each element counted once), and an
  // fp16 overflow that skips the second step.
  constexpr double kClip = 0.05;
  const Expected clipped_expected = train_reference<P>(sgd, sgd.lr, kClip);
  const Expected skipped_expected = train_reference<P>(sgd, sgd.lr, no_clip, false, /*skipped=*/1);
  test::TempDir nvme;                  // OffloadOptimizer<Nvme>: each rank's optimizer state in a file here
  for (int world = 1; world <= 8; ++world) {
    INFO("world size " << world);
    StrategyConfig config;
    if constexpr (S::sharding::hybrid) config.hybrid_group_size = hybrid_group_size(world);
    if constexpr (S::offload::to_nvme) config.nvme_path = nvme.path().string();
    if constexpr (S::offload::to_nvme && S::offload::offloads_parameters) config.max_in_cpu = 0;  // all in the file
    const Trained run = train_engine<S, Opt>(world, sgd, no_clip, config);
    // The root and the two blocks are units, except under WrapWhole: WrapBySize cuts too.
    CHECK(run.unit_numel.size() == (std::is_same_v<typename S::wrap, WrapWhole> ? 1u : 3u));
    for (const std::int64_t n : run.unit_numel)
      if (world > 1) CHECK(n % world != 0);  // every unit pads
    check_run<P>(run, expected, sgd, world, sgd.lr);
    check_sharp<P>(run, expected, sgd, world, sgd.lr);
    // The first loss is computed from weights the oracle rounds alike: float against double only.
    CHECK(run.losses[0] == Approx(expected.losses[0]).epsilon(1e-6));
    if constexpr (std::is_same_v<P, Fp32>)
      for (int s = 1; s < kSteps; ++s)
        CHECK(run.losses[std::size_t(s)] == Approx(expected.losses[std::size_t(s)]).epsilon(1e-6));
    if constexpr (S::sharding::hybrid) {
      const Trained clipped = train_engine<S, Opt>(world, sgd, kClip, config);
      check_run<P>(clipped, clipped_expected, sgd, world, sgd.lr);
      CHECK(excesses<P>(run.masters, clipped_expected, kSteps, world, sgd.lr).size() > 0);  // the clip bites
      if constexpr (P::loss_scale::dynamic) {
        const Trained skipped = train_engine<S, Opt>(world, sgd, no_clip, config, {.overflow = 1});
        CHECK(skipped.applied == std::vector<bool>{true, false, true});
        CHECK(skipped.masters_before[2] == skipped.masters_before[1]);  // the skipped step wrote nothing
        check_run<P>(skipped, skipped_expected, sgd, world, sgd.lr);
        // Hysteresis spares the scale at the first overflow; without it the scale halves.
        CHECK(skipped.final_scale == (P::loss_scale::hysteresis > 1 ? run.final_scale : run.final_scale / 2));
      }
    }
  }
}
