// Frozen parameters (set_requires_grad(false); FairScale's refresh_trainable): neither reduced
// nor updated, while every other parameter trains as it does beside them in one process.
#include <catch2/catch.hpp>

#include <iostream>
#include <set>
#include <sstream>
#include <string>

#include "engine_fixture.hpp"
#include "io/temp_dir.hpp"

using namespace polyshard;

namespace {

/// AdamW with weight decay: a frozen parameter the optimizer touched would shrink.
const AdamWConfig adamw{.lr = 1e-2, .weight_decay = 0.1};
constexpr int steps = 4;
const std::string wte = "transformer.wte.weight";

/// Which parameters are frozen when: `names` during the steps [from, until).
struct Freezing {
  std::set<std::string> names;
  int from = 0, until = steps;
  bool frozen_at(int step) const { return !names.empty() && step >= from && step < until; }
};

void set_frozen(Gpt<float>& model, const Freezing& f, bool frozen) {
  visit_parameters(model, [&](const std::string& name, Parameter<float>& p) {
    if (f.names.count(name)) p.set_requires_grad(!frozen);
  });
}

/// The oracle, without the engine: one process, flat buffers, and torch's rule for a parameter
/// without a gradient (the optimizer skips it: values and state untouched), applied by running
/// AdamW parameter by parameter over the trainable ones only.
test::Parameters reference(const Freezing& f) {
  return test::adamw_by_parameter(
      steps, [&](Gpt<float>& model, int step) { set_frozen(model, f, f.frozen_at(step)); },
      [&](int step, const auto& e) { return f.names.count(e.name) && f.frozen_at(step) ? nullptr : &adamw; });
}

/// What rank 0 saw, and whether every rank's optimizer state over the frozen parameters was
/// zero at the end.
struct FrozenRun {
  test::Parameters initial, final;
  bool frozen_state_zero = true;
};

/// Trains tiny_gpt() under S with AdamW on `world` thread ranks, freezing as `f` says (set on
/// the model before the engine is built, then changed and, with `call_refresh`, followed by
/// refresh_trainable(); without, the engine's auto_refresh_trainable reads them).
template <class S>
FrozenRun train_frozen(int world, const Freezing& f, const StrategyConfig& config = {}, bool call_refresh = true) {
  std::vector<FrozenRun> runs(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    FrozenRun& run = runs[static_cast<std::size_t>(comm.rank())];
    Gpt<float> model(test::tiny_gpt());
    set_frozen(model, f, f.frozen_at(0));
    Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, adamw, config, 42);
    run.initial = engine.full_parameters();
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    const RowRange rows = rank_rows(6, comm.rank(), world);
    const double weight = double(rows.end - rows.begin) / 6.0;
    for (int step = 0; step < steps; ++step) {
      if (step > 0 && f.frozen_at(step) != f.frozen_at(step - 1)) {
        set_frozen(model, f, f.frozen_at(step));
        if (call_refresh) engine.refresh_trainable();
      }
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, weight);
      engine.step(adamw.lr);
    }
    run.final = engine.full_parameters();
    for (std::size_t i = 0; i < engine.units().units.size(); ++i) {
      const std::int64_t begin = engine.optimizer_offset(i);
      const auto end = begin + static_cast<std::int64_t>(engine.optimizers()[i].numel());
      engine.access_optimizer(i, [&](auto& opt, auto) {
        for (const auto& [name, state] : opt.state())
          for (const auto& e : engine.units().units[i].entries) {
            if (!f.names.count(e.name)) continue;
            for (std::int64_t k = std::max(e.offset, begin); k < std::min(e.offset + e.numel(), end); ++k)
              if (state.data()[k - begin] != 0.0f) run.frozen_state_zero = false;
          }
      });
    }
  });
  FrozenRun out = std::move(runs[0]);
  for (const FrozenRun& r : runs) out.frozen_state_zero = out.frozen_state_zero && r.frozen_state_zero;
  return out;
}

const std::vector<float>& values_of(const test::Parameters& params, const std::string& name) {
  static const std::vector<float> none;
  for (const auto& [n, v] : params)
    if (n == name) return v;
  FAIL("no parameter " << name);
  return none;
}

/// Largest difference over the parameters in `names`.
double difference_in(const test::Parameters& a, const test::Parameters& b, const std::set<std::string>& names) {
  double worst = 0;
  for (const auto& name : names) {
    const auto &x = values_of(a, name), &y = values_of(b, name);
    REQUIRE(x.size() == y.size());
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::abs(x[i] - y[i])));
  }
  return worst;
}

using test::FsdpPerBlock;
using Frozen = std::tuple<DDP, ZeRO<2>, ZeRO<3>, FsdpPerBlock>;

}  // namespace

TEST_CASE("the one-process oracle: freezing leaves the frozen parameters alone and changes the others", "[engine]") {
  const Freezing frozen{{wte}};
  const auto ref = reference(frozen);
  const auto free = reference({});
  const auto initial = test::train<DDP, AdamW<float>>(1, 0, 6, adamw).parameters;
  CHECK(difference_in(ref, initial, {wte}) == 0.0);
  CHECK(difference_in(free, initial, {wte}) > 0.5 * adamw.lr);
  // Every other parameter trained, differently than beside a trained embedding.
  CHECK(test::max_difference(ref, initial) > 0.5 * adamw.lr);
  CHECK(test::max_difference(ref, free) > 0.5 * adamw.lr);
  // Without freezing, the oracle is the engine's one-process run.
  CHECK(test::max_difference(free, test::train<DDP, AdamW<float>>(1, steps, 6, adamw).parameters) == 0.0);
}

TEMPLATE_LIST_TEST_CASE("frozen parameters stay bit for bit, with zero optimizer state, the rest trains as in one "
                        "process", "[engine]", Frozen) {
  const Freezing frozen = GENERATE(Freezing{{wte}},
                                   Freezing{{wte, "transformer.h.1.attn.c_attn.weight", "transformer.h.0.ln_2.bias"}});
  CAPTURE(frozen.names.size());
  const auto ref = reference(frozen);
  for (int world : {1, 2}) {
    CAPTURE(world);
    const FrozenRun run = train_frozen<TestType>(world, frozen);
    CHECK(difference_in(run.final, run.initial, frozen.names) == 0.0);
    CHECK(run.frozen_state_zero);
    if (world == 1) CHECK(test::max_difference(run.final, ref) == 0.0);
    // Across world sizes only the order of sums differs (Adam magnifies it: see test_equivalence).
    CHECK(test::max_difference(run.final, ref) < 0.01 * adamw.lr);
    // Stepped in sub-groups of 37 elements, which frozen ranges and shard bounds cut anywhere:
    // the same bits, the frozen state still zero.
    StrategyConfig pieces;
    pieces.sub_group_size = 37;
    const FrozenRun cut = train_frozen<TestType>(world, frozen, pieces);
    CHECK(test::max_difference(cut.final, run.final) == 0.0);
    CHECK(cut.frozen_state_zero);
  }
}

TEST_CASE("frozen parameters: the sharded stages agree bit for bit at world size 2", "[engine]") {
  const Freezing frozen{{wte, "transformer.h.1.mlp.c_fc.weight"}};
  const FrozenRun zero2 = train_frozen<Strategy<ShardGradients, WrapByType<Block>>>(2, frozen);
  CHECK(test::max_difference(train_frozen<FsdpPerBlock>(2, frozen).final, zero2.final) == 0.0);
  CHECK(test::max_difference(train_frozen<Strategy<ShardOptimizerState, WrapByType<Block>>>(2, frozen).final,
                             zero2.final) == 0.0);
}

TEST_CASE("refresh_trainable: an unfrozen parameter trains again, a frozen one keeps its values and state",
          "[engine]") {
  // Frozen for two steps, then trained; trained, frozen for two steps, then trained again (its
  // Adam moments from step 1 must have survived the frozen steps).
  const Freezing schedule = GENERATE(Freezing{{wte}, 0, 2}, Freezing{{wte}, 1, 3});
  CAPTURE(schedule.from, schedule.until);
  const auto ref = reference(schedule);
  const auto frozen_throughout = reference({{wte}});
  CHECK(difference_in(ref, frozen_throughout, {wte}) > 0.5 * adamw.lr);  // wte trained
  for (int world : {1, 2}) {
    CAPTURE(world);
    const FrozenRun ddp = train_frozen<DDP>(world, schedule);
    const FrozenRun zero3 = train_frozen<FsdpPerBlock>(world, schedule);
    CHECK(difference_in(ddp.final, ddp.initial, {wte}) > 0.5 * adamw.lr);
    const double tolerance = world == 1 ? 0.0 : 0.01 * adamw.lr;
    CHECK(test::max_difference(ddp.final, ref) <= tolerance);
    CHECK(test::max_difference(zero3.final, ref) <= tolerance);
  }
}

TEST_CASE("auto_refresh_trainable: forward reads changed requires_grad flags, as refresh_trainable does",
          "[engine]") {
  // FairScale's default: the same parameters at the end as with refresh_trainable() called, and
  // a warning naming the parameter, unless warn_on_trainable_params_changed is off.
  const Freezing schedule{{wte}, 1, 3};
  const auto warnings_of = [&](bool warn, test::Parameters& final) {
    std::ostringstream captured;
    std::streambuf* saved = std::clog.rdbuf(captured.rdbuf());
    StrategyConfig config;
    config.warn_on_trainable_params_changed = warn;
    final = train_frozen<DDP>(1, schedule, config, /*call_refresh=*/false).final;
    std::clog.rdbuf(saved);
    return captured.str();
  };
  test::Parameters warned, quiet;
  const std::string text = warnings_of(true, warned);
  CHECK_THAT(text, Catch::Contains("polyshard: warning: parameter 'transformer.wte.weight' was frozen") &&
                       Catch::Contains("auto_refresh_trainable"));
  CHECK_THAT(text, Catch::Contains("parameter 'transformer.wte.weight' was unfrozen"));
  CHECK(warnings_of(false, quiet).empty());
  const FrozenRun explicit_refresh = train_frozen<DDP>(1, schedule);
  CHECK(test::max_difference(warned, explicit_refresh.final) == 0.0);
  CHECK(test::max_difference(quiet, explicit_refresh.final) == 0.0);
  // Two ranks (no warnings: the ranks are threads sharing std::clog).
  StrategyConfig quiet_config;
  quiet_config.warn_on_trainable_params_changed = false;
  CHECK(test::max_difference(train_frozen<FsdpPerBlock>(2, schedule, quiet_config, false).final,
                             train_frozen<FsdpPerBlock>(2, schedule).final) == 0.0);
}

TEST_CASE("forward refuses requires_grad flags changed behind the engine's back", "[engine]") {
  std::string error;
  try {
    run_ranks(1, [&](ThreadCommunicator& comm) {
      Gpt<float> model(test::tiny_gpt());
      StrategyConfig config;
      config.auto_refresh_trainable = false;
      Engine<ZeRO<3>, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, adamw, config);
      BatchSampler sampler(test::tiny_data(), 8, 6, 7);
      const Batch b = sampler.batch(0);
      model.transformer.wte.weight.set_requires_grad(false);
      engine.forward([&] { return model.loss(b.inputs, b.targets); });
    });
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Contains("parameter 'transformer.wte.weight' was frozen") &&
                        Catch::Contains("call refresh_trainable()"));
}

#ifdef POLYSHARD_HAVE_LIBURING
TEST_CASE("frozen parameters: bf16 ZeRO-Infinity in sub-groups that hold the masters ends as ZeRO-3 in memory",
          "[engine][nvme]") {
  // A frozen range keeps the fused step from writing the bf16 copy, so each sub-group casts its
  // own masters into its slice of it before they go back to the file.
  const Freezing frozen{{wte, "transformer.h.1.mlp.c_fc.weight"}};
  test::TempDir dir;
  StrategyConfig nvme;
  nvme.nvme_path = dir.path().string();
  nvme.optimizer_buffer_count = 8;  // two AdamW sub-groups in memory
  nvme.sub_group_size = 37;
  using Memory = Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>;
  using Infinity = Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, WrapByType<Block>, Bf16Mixed>;
  for (int world : {1, 2}) {
    CAPTURE(world);
    const FrozenRun memory = train_frozen<Memory>(world, frozen);
    const FrozenRun offloaded = train_frozen<Infinity>(world, frozen, nvme);
    CHECK(test::max_difference(offloaded.final, memory.final) == 0.0);
    CHECK(difference_in(offloaded.final, offloaded.initial, frozen.names) == 0.0);
    CHECK(test::max_difference(offloaded.final, offloaded.initial) > 0.5 * adamw.lr);
    CHECK(offloaded.frozen_state_zero);
  }
}
#endif
