// Measured bytes sent and model-state bytes equal the compile-time formulas, and those equal
// ZeRO's.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"

using namespace polyshard;
using test::train;

using Fsdp = Strategy<ShardParameters<true>, WrapByType<Block>>;
using GradOp = Strategy<ShardParameters<false>, WrapByType<Block>>;
using Accounted = std::tuple<DDP, ZeRO<1>, ZeRO<2>, ZeRO<3>, Fsdp, GradOp, Strategy<ShardGradients, Bf16Mixed>,
                             Strategy<ShardParameters<true>, Fp16Mixed, WrapByType<Block>>>;

TEMPLATE_LIST_TEST_CASE("bytes sent and model state equal the compile-time accounting", "[engine]", Accounted) {
  const int world = GENERATE(1, 2, 3, 4);
  CAPTURE(world);
  const auto r = train<TestType>(world, 2);
  REQUIRE(r.padded % world == 0);
  const double expected_bytes = bytes_sent_per_step<TestType>(r.padded, r.root_padded, world);
  CHECK(r.bytes_sent == Approx(expected_bytes).epsilon(1e-12).margin(1e-9));
  // SGD with momentum keeps one state value per parameter.
  CHECK(double(r.model_state) == Approx(model_state_bytes<TestType>(r.padded, world, 1)).epsilon(1e-12));
}

TEST_CASE("the accounting formulas are ZeRO's", "[engine]") {
  const std::int64_t p = 1'000'000 * 12;  // divisible by every N below
  for (int n : {1, 2, 3, 4}) {
    // Mixed-precision Adam: 2 + 2 + 12 bytes per parameter.
    using Mixed = Bf16Mixed;
    CHECK(model_state_bytes<Strategy<NoShard, Mixed>>(p, n) == Approx(16.0 * p));
    CHECK(model_state_bytes<Strategy<ShardOptimizerState, Mixed>>(p, n) == Approx((4.0 + 12.0 / n) * p));
    CHECK(model_state_bytes<Strategy<ShardGradients, Mixed>>(p, n) == Approx((2.0 + 14.0 / n) * p));
    CHECK(model_state_bytes<Strategy<ShardParameters<>, Mixed>>(p, n) == Approx(16.0 / n * p));
    // Communication in units of the parameter bytes (fp32): 2(N-1)/N for DDP, ZeRO-1 and ZeRO-2;
    // 3(N-1)/N for ZeRO-3 (with a root unit of no parameters).
    const double f = double(n - 1) / n, bytes = 4.0 * p;
    CHECK(bytes_sent_per_step<DDP>(p, 0, n) == Approx(2 * f * bytes));
    CHECK(bytes_sent_per_step<ZeRO<1>>(p, 0, n) == Approx(2 * f * bytes));
    CHECK(bytes_sent_per_step<ZeRO<2>>(p, 0, n) == Approx(2 * f * bytes));
    CHECK(bytes_sent_per_step<ZeRO<3>>(p, 0, n) == Approx(3 * f * bytes));
  }
}
