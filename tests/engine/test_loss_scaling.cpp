// Loss scaling: DeepSpeed's dynamic rules, and an overflow that skips the step and changes no
// parameter.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"

using namespace polyshard;

TEST_CASE("dynamic loss scale: hysteresis, window and minimum", "[engine]") {
  LossScaler<DynamicLossScale<4, 3, 2, 2>> s;  // 2^4, window 3, hysteresis 2, min 2
  CHECK(s.scale() == 16);
  CHECK_FALSE(s.update(true));  // first overflow: absorbed by hysteresis
  CHECK(s.scale() == 16);
  CHECK_FALSE(s.update(true));  // second: halves
  CHECK(s.scale() == 8);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 8);
  CHECK(s.update(false));  // third good step in a row: doubles
  CHECK(s.scale() == 16);
  for (int i = 0; i < 10; ++i) s.update(true);
  CHECK(s.scale() == 2);  // never below min_loss_scale
  CHECK(s.skipped_steps() == 12);

  LossScaler<DynamicLossScale<>> defaults;
  CHECK(defaults.scale() == 65536.0);  // initial_scale_power 16
  LossScaler<DynamicLossScale<>> fixed(128.0);  // loss_scale > 0: static
  fixed.update(true);
  CHECK(fixed.scale() == 128.0);
}

namespace {
/// Runs two steps of fp16 mixed precision on `world` ranks; the first backward is seeded with
/// `first_weight` (a huge one overflows fp16). Returns parameters before and after each step.
template <class S>
struct OverflowRun {
  test::Parameters initial, after_first, after_second;
  bool first_applied = true, second_applied = false;
  double scale_after_first = 0, scale_after_second = 0;
};

template <class S>
OverflowRun<S> run_with_overflow(int world, double first_weight) {
  OverflowRun<S> out;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    auto initial = engine.full_parameters();
    bool applied[2];
    test::Parameters after[2];
    double scales[2];
    for (int step = 0; step < 2; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      const RowRange rows = rank_rows(6, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      const double weight = double(rows.end - rows.begin) / 6.0;
      engine.backward(loss, step == 0 ? first_weight * weight : weight);
      loss = Var<float>();
      applied[step] = engine.step(0.1);
      scales[step] = engine.loss_scaler().scale();
      after[step] = engine.full_parameters();
    }
    if (comm.rank() == 0) {
      out.initial = initial;
      out.after_first = after[0];
      out.after_second = after[1];
      out.first_applied = applied[0];
      out.second_applied = applied[1];
      out.scale_after_first = scales[0];
      out.scale_after_second = scales[1];
    }
  });
  return out;
}
}  // namespace

using ImmediateHalving = MixedPrecision<polyshard::half, polyshard::half, float, DynamicLossScale<8, 1000, 1, 1>>;
using Scaled = std::tuple<Strategy<NoShard, ImmediateHalving>, Strategy<ShardGradients, ImmediateHalving>,
                          Strategy<ShardParameters<true>, ImmediateHalving, WrapByType<Block>>>;

TEMPLATE_LIST_TEST_CASE("an overflow skips the step, halves the scale and changes no parameter", "[engine]", Scaled) {
  const int world = GENERATE(1, 2, 3);
  CAPTURE(world);
  // 1e30 times the loss overflows fp16 in the first backward.
  const auto r = run_with_overflow<TestType>(world, 1e30);
  CHECK_FALSE(r.first_applied);
  CHECK(test::max_difference(r.after_first, r.initial) == 0.0);
  CHECK(r.scale_after_first == 128.0);  // 2^8 halved at once (hysteresis 1)
  CHECK(r.second_applied);
  CHECK(test::max_difference(r.after_second, r.initial) > 1e-4);
  CHECK(r.scale_after_second == 128.0);

  // Without the injected overflow, the same run takes both steps.
  const auto clean = run_with_overflow<TestType>(world, 1.0);
  CHECK(clean.first_applied);
  CHECK(clean.scale_after_first == 256.0);
}

TEST_CASE("fp16 and bf16 mixed precision train close to fp32", "[engine]") {
  const auto reference = test::train<DDP>(1);
  const auto initial = test::train<DDP>(1, 0);
  const double moved = test::max_difference(reference.parameters, initial.parameters);
  for (int world : {1, 3}) {
    const double bf16 = test::max_difference(test::train<Strategy<ShardGradients, Bf16Mixed>>(world).parameters,
                                             reference.parameters);
    const double fp16 = test::max_difference(
        test::train<Strategy<ShardParameters<true>, Fp16Mixed, WrapByType<Block>>>(world).parameters,
        reference.parameters);
    // 16-bit parameters are rounded to 8 (bf16) or 11 (fp16) significant bits.
    CHECK(bf16 < 0.05 * moved + 1e-2);
    CHECK(fp16 < 0.05 * moved + 2e-3);
  }
}
