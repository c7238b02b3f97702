// ZeRO-Offload's delayed parameter update (StrategyConfig::delayed_parameter_update): the host
// steps while the next forward and backward run, so each step computes with the parameters of
// the step before the last. Held to the double-precision oracle that applies every gradient one
// step late, and shown apart from the oracle that does not.
#include <catch2/catch.hpp>

#include "oracle_fixture.hpp"

using namespace polyshard;
using namespace polyshard::test::oracle;

namespace {
using Delayed = std::tuple<Strategy<ShardGradients, OffloadOptimizer<Cpu>, Bf16Mixed>,
                           Strategy<ShardOptimizerState, OffloadOptimizer<Cpu>, Bf16Mixed>,
                           Strategy<ShardParameters<true>, OffloadParameters<Cpu>, WrapByType<Block>, Bf16Mixed>>;
constexpr double no_clip = std::numeric_limits<double>::infinity();
}  // namespace

TEMPLATE_LIST_TEST_CASE("a delayed parameter update trains as the oracle that applies each gradient a step late",
                        "[engine][offload]", Delayed) {
  using P = typename TestType::precision;
  const SgdConfig sgd = test::momentum_sgd();
  const Expected late = train_reference<P>(sgd, sgd.lr, no_clip, /*delayed=*/true);
  const Expected prompt = train_reference<P>(sgd, sgd.lr, no_clip);
  REQUIRE_FALSE(late.overflowed);
  StrategyConfig config;
  config.delayed_parameter_update = true;
  for (const int world : {1, 3}) {
    INFO("world size " << world);
    const Trained run = train_engine<TestType, Sgd<float>>(world, sgd, no_clip, config);
    // The first two steps compute with the initial weights (the first update lands during the
    // second step): float against double only. Without the delay, the second would not.
    CHECK(run.losses[0] == Approx(late.losses[0]).epsilon(1e-6));
    CHECK(run.losses[1] == Approx(late.losses[1]).epsilon(1e-6));
    CHECK(std::abs(run.losses[1] - prompt.losses[1]) > 100 * 1e-6 * std::abs(prompt.losses[1]));
    // Every update applied, the last one by complete_delayed_update(); the masters cannot be read
    // between steps (the host thread may be writing them), so check_run holds the last ones.
    check_run<P>(run, late, sgd, world, sgd.lr);
    CHECK(excesses<P>(run.masters, prompt, kSteps, world, sgd.lr).size() > 0);
  }
}

TEST_CASE("a delayed parameter update is refused where it cannot run beside forward", "[engine][offload]") {
  StrategyConfig config;
  config.delayed_parameter_update = true;
  // Without an optimizer offloaded to the host, nothing steps beside the device.
  CHECK_THROWS_WITH((train_engine<Strategy<ShardGradients, Bf16Mixed>, Sgd<float>>(1, test::momentum_sgd(), no_clip,
                                                                                   config)),
                    Catch::Contains("delayed_parameter_update is read only under OffloadOptimizer<Cpu>") &&
                        Catch::Contains("NoOffload"));
  // fp32 on the host: the master weights are the parameters forward reads.
  CHECK_THROWS_WITH((train_engine<Strategy<ShardGradients, OffloadOptimizer<Cpu>>, Sgd<float>>(
                        1, test::momentum_sgd(), no_clip, config)),
                    Catch::Contains("the master weights are the parameters forward reads"));
}
