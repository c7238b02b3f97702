// Loss scaling: DeepSpeed's dynamic rules, and an overflow that skips the step and changes no
// parameter.
#include <catch2/catch.hpp>

#include <string>
#include <type_traits>
#include <vector>

#include "engine_fixture.hpp"
#include "oracle_fixture.hpp"
#include "support/error_of.hpp"

using namespace polyshard;

namespace {
// Feeds `outcomes` (O: overflow, G: a good step) to `s` and returns the scale after each.
template <class Scale>
std::vector<double> scales_after(LossScaler<Scale>& s, const std::string& outcomes) {
  std::vector<double> out;
  for (char c : outcomes) {
    CHECK(s.update(c == 'O') == (c == 'G'));  // an overflow skips its step, a good step is applied
    out.push_back(s.scale());
  }
  return out;
}
}  // namespace

// The sequences below are worked out by hand from each reference's rule (policy/precision.hpp).
TEST_CASE("DeepSpeed's dynamic loss scale: hysteresis spent, not restored by halving, window, minimum",
          "[engine][loss_scale]") {
  LossScaler<DynamicLossScale<4, 3, 2, 2>> s;  // 2^4, window 3, hysteresis 2, min 2
  CHECK(s.scale() == 16);
  // O: one unit of hysteresis spent (16); O: halves (8); G G G: doubles, hysteresis back to 2
  // (16); O: spent (16); O O O: halves at each overflow, the budget staying spent (8, 4, 2);
  // O: at the minimum (2); G: not a whole window, so no hysteresis back; O: halves again at once,
  // held at the minimum (2).
  CHECK(scales_after(s, "OOGGGOOOOOGO") == std::vector<double>{16, 8, 8, 8, 16, 16, 8, 4, 2, 2, 2, 2});
  CHECK(s.skipped_steps() == 8);  // the eight overflows

  LossScaler<DynamicLossScale<>> defaults;  // initial_scale_power 16, hysteresis 2
  CHECK(defaults.scale() == 65536.0);
  CHECK(scales_after(defaults, "OOOO") == std::vector<double>{65536, 32768, 16384, 8192});
  LossScaler<DynamicLossScale<>> fixed(128.0);  // loss_scale > 0: static
  fixed.update(true);
  CHECK(fixed.scale() == 128.0);
}

TEST_CASE("DeepSpeed's consecutive_hysteresis: every good step restores the hysteresis", "[engine][loss_scale]") {
  LossScaler<DynamicLossScale<4, 3, 2, 2, true>> s;
  // O: spent (16); G: restored; O: spent again (16); O: halves (8); G: restored; O: spent (8).
  CHECK(scales_after(s, "OGOOGO") == std::vector<double>{16, 16, 16, 8, 8, 8});
}

TEST_CASE("PyTorch's GradScaler: back-off at every overflow, no minimum, growth after the interval",
          "[engine][loss_scale]") {
  LossScaler<GradScalerLossScale<4, 3>> s;  // init_scale 2^4, growth_interval 3
  CHECK(s.scale() == 16);
  // O O: halves each time (8, 4); G G G: grows (8); O O O O: 4, 2, 1, 0.5 (no floor at 1).
  CHECK(scales_after(s, "OOGGGOOOO") == std::vector<double>{8, 4, 4, 4, 8, 4, 2, 1, 0.5});
  LossScaler<GradScalerLossScale<>> defaults;  // init_scale 65536, growth_interval 2000
  CHECK(defaults.scale() == 65536.0);
  for (int i = 0; i < 1999; ++i) defaults.update(false);
  CHECK(defaults.scale() == 65536.0);
  defaults.update(false);
  CHECK(defaults.scale() == 131072.0);
}

TEST_CASE("loss-scale settings at run time: StrategyConfig's replace the policy's numbers, one by one",
          "[engine][loss_scale]") {
  // The policy's own rule, unset settings: DeepSpeed's defaults, as Fp16Mixed carries them.
  const LossScaler<Fp16Mixed::loss_scale> unset{StrategyConfig{}};
  CHECK(unset.scale() == 65536.0);
  CHECK(unset.rule().window == 1000);
  CHECK(unset.rule().hysteresis == 2);
  CHECK(unset.rule().min_scale == 1.0);

  // Every setting at once, from DynamicLossScale<>'s defaults to DynamicLossScale<4, 3, 2, 2>'s:
  // the same sequence as the first case above, worked out there by hand.
  StrategyConfig c;
  c.initial_scale_power = 4;
  c.loss_scale_window = 3;
  c.min_loss_scale = 2;
  LossScaler<DynamicLossScale<>> s(c);
  CHECK(s.scale() == 16);
  CHECK(scales_after(s, "OOGGGOOOOOGO") == std::vector<double>{16, 8, 8, 8, 16, 16, 8, 4, 2, 2, 2, 2});

  // Each alone, against the policy's numbers for the others:
  struct Row {
    const char* setting;
    StrategyConfig config;
    std::string outcomes;
    std::vector<double> scales;
  };
  const std::vector<Row> rows{
      // From 2^3, hysteresis 2 (the policy's): O spends it, O O halve (4, 2), O halves to 1, O: floor 1.
      {"initial_scale_power = 3", StrategyConfig{.initial_scale_power = 3}, "OOOOO", {8, 4, 2, 1, 1}},
      // Window 2 from 65536: G G doubles, G G doubles again.
      {"loss_scale_window = 2", StrategyConfig{.loss_scale_window = 2}, "GGGG", {65536, 131072, 131072, 262144}},
      // Hysteresis 3: two overflows spend it, the third halves.
      {"hysteresis = 3", StrategyConfig{.hysteresis = 3}, "OOOO", {65536, 65536, 32768, 16384}},
      // Floor 16384: the second halving stops there.
      {"min_loss_scale = 16384", StrategyConfig{.min_loss_scale = 16384}, "OOOO", {65536, 32768, 16384, 16384}},
  };
  for (const Row& row : rows) {
    CAPTURE(row.setting);
    LossScaler<DynamicLossScale<>> one(row.config);
    CHECK(scales_after(one, row.outcomes) == row.scales);
  }

  // PyTorch's GradScaler takes the initial power and the growth interval (loss_scale_window).
  StrategyConfig g;
  g.initial_scale_power = 4;
  g.loss_scale_window = 3;
  LossScaler<GradScalerLossScale<>> grad_scaler(g);
  CHECK(scales_after(grad_scaler, "OOGGGOOOO") == std::vector<double>{8, 4, 4, 4, 8, 4, 2, 1, 0.5});
}

TEST_CASE("loss-scale settings that the policy's scaler has no use for are refused, naming them",
          "[engine][loss_scale]") {
  const auto refusal = [](auto scaler_tag, StrategyConfig c) {
    using Scale = typename decltype(scaler_tag)::type;
    return test::error_of([&] { LossScaler<Scale> s(c); });
  };
  // No scaling at all (bf16, fp32): every setting.
  CHECK_THAT(refusal(std::type_identity<NoLossScale>{}, StrategyConfig{.loss_scale = 128}),
             Catch::Contains("StrategyConfig::loss_scale") && Catch::Contains("scales no loss"));
  CHECK_THAT(refusal(std::type_identity<NoLossScale>{}, StrategyConfig{.hysteresis = 2}),
             Catch::Contains("StrategyConfig::hysteresis") && Catch::Contains("scales no loss"));
  // A static scale: the dynamic settings.
  CHECK_THAT(refusal(std::type_identity<StaticLossScale<8>>{}, StrategyConfig{.loss_scale_window = 5}),
             Catch::Contains("StrategyConfig::loss_scale_window") && Catch::Contains("static"));
  // loss_scale > 0 and a dynamic setting contradict each other.
  CHECK_THAT(refusal(std::type_identity<DynamicLossScale<>>{}, StrategyConfig{.loss_scale = 8, .min_loss_scale = 2}),
             Catch::Contains("StrategyConfig::min_loss_scale") && Catch::Contains("set one or the other"));
  // PyTorch's GradScaler has no hysteresis and no floor.
  CHECK_THAT(refusal(std::type_identity<GradScalerLossScale<>>{}, StrategyConfig{.hysteresis = 2}),
             Catch::Contains("StrategyConfig::hysteresis") && Catch::Contains("GradScaler"));
  CHECK_THAT(refusal(std::type_identity<GradScalerLossScale<>>{}, StrategyConfig{.min_loss_scale = 1}),
             Catch::Contains("StrategyConfig::min_loss_scale") && Catch::Contains("GradScaler"));
  // Values out of range.
  CHECK_THAT(refusal(std::type_identity<DynamicLossScale<>>{}, StrategyConfig{.initial_scale_power = 63}),
             Catch::Contains("initial_scale_power = 63"));
  CHECK_THAT(refusal(std::type_identity<DynamicLossScale<>>{}, StrategyConfig{.loss_scale_window = 0}),
             Catch::Contains("loss_scale_window = 0"));
  CHECK_THAT(refusal(std::type_identity<DynamicLossScale<>>{}, StrategyConfig{.min_loss_scale = 0}),
             Catch::Contains("min_loss_scale = 0"));
  CHECK_THAT(refusal(std::type_identity<DynamicLossScale<>>{}, StrategyConfig{.loss_scale = -1}),
             Catch::Contains("loss_scale = -1"));
}

TEST_CASE("an engine takes its loss-scale settings from StrategyConfig and refuses those that do not apply",
          "[engine][loss_scale]") {
  StrategyConfig c;
  c.initial_scale_power = 5;
  c.hysteresis = 4;
  double scale = 0;
  int hysteresis_left = 0;
  std::string bf16_refusal;
  run_ranks(1, [&](ThreadCommunicator& comm) {  // records here, checks on the test's thread
    Gpt<float> model(test::tiny_gpt());
    Engine<Strategy<NoShard, Fp16Mixed>, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm,
                                                                                           test::momentum_sgd(), c, 42);
    scale = engine.loss_scaler().scale();
    hysteresis_left = engine.loss_scaler().hysteresis_left();
    Gpt<float> bf16_model(test::tiny_gpt());
    bf16_refusal = test::error_of([&] {
      Engine<Strategy<NoShard, Bf16Mixed>, Gpt<float>, ThreadCommunicator, Sgd<float>> bf16(bf16_model, comm,
                                                                                          test::momentum_sgd(), c, 42);
    });
  });
  CHECK(scale == 32);
  CHECK(hysteresis_left == 4);
  CHECK_THAT(bf16_refusal, Catch::Contains("StrategyConfig::initial_scale_power") && Catch::Contains("scales no loss"));
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
// PyTorch's GradScaler from 2^8, as FSDP's fp16 runs it: it too halves at the first overflow.
using GradScaler256 = MixedPrecision<polyshard::half, polyshard::half, float, GradScalerLossScale<8>>;
using Scaled = std::tuple<Strategy<NoShard, ImmediateHalving>, Strategy<ShardGradients, ImmediateHalving>,
                          Strategy<ShardParameters<true>, ImmediateHalving, WrapByType<Block>>,
                          Strategy<ShardParameters<true>, GradScaler256, WrapByType<Block>>>;

TEMPLATE_LIST_TEST_CASE("an overflow skips the step, halves the scale and changes no parameter", "[engine]", Scaled) {
  const int world = GENERATE(1, 2, 3);
  CAPTURE(world);
  // 1e30 times the loss overflows fp16 in the first backward.
  const auto r = run_with_overflow<TestType>(world, 1e30);
  CHECK_FALSE(r.first_applied);
  CHECK(test::max_difference(r.after_first, r.initial) == 0.0);
  CHECK(r.scale_after_first == 128.0);  // 2^8 halved at once (hysteresis 1; GradScaler's backoff)
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

// FairScale's reduce_fp16 (ShardedDDP: fp32 compute, gradients reduced in fp16) and FSDP's
// fp32_reduce_scatter (fp16 compute, gradients reduced in fp32): what the reductions move, as the
// in-process backend measured it, is in the reduce type (half or twice the bytes of the same
// sharding reducing in the other width, the parameters' all-gathers unchanged), and each trains
// close to fp32. The fp16 reduction rounds: reduce_fp16 is not ZeRO-2 in fp32 bit for bit.
using ReduceFp16 = Strategy<ShardGradients, MixedPrecision<float, polyshard::half>>;
using Fp32ReduceScatter =
    Strategy<ShardParameters<true>, MixedPrecision<polyshard::half, float, float, GradScalerLossScale<>>,
             WrapByType<Block>>;
TEST_CASE("reduce_fp16 and fp32_reduce_scatter reduce in their reduce type and train close to fp32", "[engine]") {
  const auto reduced = [](const test::RunResult& r) {
    double bytes = 0;
    // The gradients' reductions (an all-reduce carries a scaler's overflow flag, in float for both).
    for (CollectiveKind k : {CollectiveKind::ReduceScatter, CollectiveKind::Reduce})
      if (r.traffic.count(k)) bytes += r.traffic.at(k).first;
    return bytes;
  };
  const auto gathered = [](const test::RunResult& r) {
    return r.traffic.count(CollectiveKind::AllGather) ? r.traffic.at(CollectiveKind::AllGather).first : 0.0;
  };
  const auto reference = test::train<DDP>(1);
  const double moved = test::max_difference(reference.parameters, test::train<DDP>(1, 0).parameters);
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto fp16 = test::train<ReduceFp16>(world);
    const auto fp32 = test::train<ZeRO<2>>(world);
    CHECK(reduced(fp16) > 0);
    CHECK(2 * reduced(fp16) == Approx(reduced(fp32)).epsilon(1e-12));
    CHECK(gathered(fp16) == Approx(gathered(fp32)).epsilon(1e-12));
    CHECK(test::max_difference(fp16.parameters, fp32.parameters) > 0);
    CHECK(test::max_difference(fp16.parameters, reference.parameters) < 0.05 * moved + 2e-3);

    const auto wide = test::train<Fp32ReduceScatter>(world);
    const auto narrow = test::train<Strategy<ShardParameters<true>, Fp16Mixed, WrapByType<Block>>>(world);
    CHECK(reduced(wide) > 0);
    CHECK(reduced(wide) == Approx(2 * reduced(narrow)).epsilon(1e-12));
    CHECK(gathered(wide) == Approx(gathered(narrow)).epsilon(1e-12));
    CHECK(test::max_difference(wide.parameters, reference.parameters) < 0.05 * moved + 2e-3);
  }
}

namespace {
/// One SGD step (no momentum) of `world` ranks under S, the backward seeded with `weight`: how
/// far each fp32 master weight of rank 0 moved.
template <class S>
std::vector<double> one_step_movement(int world, double weight, double lr) {
  std::vector<double> moved;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, SgdConfig{.lr = lr}, {}, 42);
    const auto masters = [&] {
      std::vector<double> all;
      for (const auto& [first, values] : test::oracle::snapshot_of(engine))
        all.insert(all.end(), values.begin(), values.end());
      return all;
    };
    const Batch b = BatchSampler(test::tiny_data(), 8, 6, 7).batch(0, comm.rank(), world);
    const RowRange rows = rank_rows(6, comm.rank(), world);
    const std::vector<double> before = masters();
    Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
    engine.backward(loss, weight * double(rows.end - rows.begin) / 6.0);
    loss = Var<float>();
    engine.step(lr);
    std::vector<double> after = masters();
    for (std::size_t i = 0; i < after.size(); ++i) after[i] -= before[i];
    if (comm.rank() == 0) moved = std::move(after);
  });
  return moved;
}
}  // namespace

// A loss scale exists so that gradients below fp16's range survive the reduction. Unscaled
// back into fp16 they would underflow all the same (fp16's smallest subnormal is 6e-8, its
// normals start at 6.1e-5): the unscaling has to happen in fp32, on the way into the update,
// as DeepSpeed and PyTorch's GradScaler do it. Then SGD's step of a loss weighted by 1e-7 at
// 1e7 times the learning rate is the step of the loss itself.
TEST_CASE("fp16 gradients far below fp16's range move the weights as gradients in range do", "[engine][loss_scale]") {
  const int world = GENERATE(1, 2);
  CAPTURE(world);
  using Fp16 = Strategy<NoShard, Fp16Mixed>;
  const auto in_range = one_step_movement<Fp16>(world, 1.0, 1e-3);
  // Gradients of 1e-9 to 2e-8, scaled by 2^16 into fp16's normals.
  const auto tiny = one_step_movement<Fp16>(world, 1e-7, 1e4);
  REQUIRE(tiny.size() == in_range.size());
  double largest = 0, worst = 0;
  for (std::size_t i = 0; i < in_range.size(); ++i) {
    largest = std::max(largest, std::abs(in_range[i]));
    worst = std::max(worst, std::abs(tiny[i] - in_range[i]));
  }
  CAPTURE(largest, worst);
  REQUIRE(largest > 1e-5);  // the step moved the weights well beyond fp32's rounding of them
  // Each run rounds its own scaled gradients to fp16 (11 significant bits).
  CHECK(worst < 2e-3 * largest);
}

namespace {
/// Plain SGD with the Optimizer concept's two-argument step alone (no grad_scale), as a user
/// might write it: p += -lr * g, as Sgd computes it.
struct TwoArgumentSgd {
  using param_type = float;
  using config_type = SgdConfig;
  TwoArgumentSgd(SgdConfig config, std::size_t numel) : lr_(config.lr), numel_(numel) {}
  template <class G>
  void step(std::span<float> params, std::span<const G> grads) {
    const auto neg_lr = static_cast<float>(-lr_);
    for (std::size_t i = 0; i < params.size(); ++i) params[i] = params[i] + neg_lr * static_cast<float>(grads[i]);
    ++steps_;
  }
  std::int64_t step_count() const { return steps_; }
  void set_step_count(std::int64_t n) { steps_ = n; }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  std::size_t numel() const { return numel_; }
  std::size_t state_bytes() const { return 0; }
  std::vector<std::pair<std::string, Tensor<float>>> state() const { return {}; }

  double lr_;
  std::size_t numel_;
  std::int64_t steps_ = 0;
};
static_assert(Optimizer<TwoArgumentSgd>);
}  // namespace

TEST_CASE("an optimizer without grad_scale gets its gradients clipped in place: Sgd's bits", "[engine]") {
  const int world = GENERATE(1, 2);
  CAPTURE(world);
  const SgdConfig sgd{.lr = 0.1};
  const double clip = 0.05;  // well below the tiny model's gradient norm
  const auto own = test::train<DDP, TwoArgumentSgd>(world, 2, 6, sgd, clip);
  const auto library = test::train<DDP, Sgd<float>>(world, 2, 6, sgd, clip);
  const auto unclipped = test::train<DDP, Sgd<float>>(world, 2, 6, sgd);
  CHECK(test::max_difference(own.parameters, library.parameters) == 0.0);
  CHECK(test::max_difference(library.parameters, unclipped.parameters) > 1e-3);  // the clipping mattered
}
