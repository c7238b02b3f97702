// The oracle comparison shared by the engine tests that train against tests/support's reference
// trainer: a test model whose units divide by no world size from 2 to 8, a run of any strategy on
// thread ranks that reads back the fp32 master weights (not through Engine::full_parameters(),
// which the strategies under test share), and the tolerances of 16-bit precision derived below.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <ostream>
#include <tuple>

#include "engine_fixture.hpp"
#include "polyshard/engine/sharded_construction.hpp"
#include "support/reference_trainer.hpp"

namespace polyshard::test::oracle {

/// 13 channels and a 23-row root (13 tokens, 8 positions, the final norm's 2): the root has
/// 13 * 23 = 299 parameters and each block 12 * 13^2 + 13 * 13 = 2,197 = 13^3, neither
/// divisible by 2, 3, 4, 5, 6, 7 or 8.
inline GptConfig padded_gpt() { return {.vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = 1, .n_embd = 13}; }

constexpr std::uint64_t kSeed = 42;
constexpr std::int64_t kBatch = 8;  // rows of the global batch: every rank has one at world size 8
constexpr int kSteps = 3;

/// Weights by parameter name.
using Named = std::map<std::string, std::vector<double>>;

/// What a run left: each step's global mean loss, and the master weights by parameter name.
struct Trained {
  std::vector<double> losses;
  Named masters;                    // after the last step
  std::vector<Named> masters_before;  // [s]: the masters step s computed with (none under a delayed update)
  std::vector<std::int64_t> unit_numel;  // parameters per unit, unpadded
  // Elements on which two ranks hold a copy of the same master (a replicated unit) that differs
  // in any bit: every rank applies the same reduced gradient, so every copy must be the same.
  std::size_t replica_mismatches = 0;
  std::vector<bool> applied;        // [s]: whether step s was applied (Engine::step's verdict)
  double final_scale = 1;           // the loss scale after the run
};

/// Steps a run takes differently from the others: the controls that must fail, and the runtime
/// options the oracle follows too.
struct Irregular {
  int zero_lr = -1;   // this step at learning rate 0 (its momentum still gathered)
  int overflow = -1;  // this step's backward seeded 1e30 times larger: fp16 gradients overflow, the step is skipped
};

/// One rank's share: its losses (weighted by its rows) and the master elements it holds.
struct RankMasters {
  using Snapshot = std::vector<std::pair<std::int64_t, std::vector<double>>>;  // per unit: (first element, values)
  std::vector<double> losses;
  std::vector<Snapshot> snapshots;  // before each step, then after the last
  std::vector<bool> applied;
  double final_scale = 1;
  std::vector<std::vector<std::tuple<std::string, std::int64_t, std::int64_t>>> layout;  // (name, offset, numel)
  std::vector<std::int64_t> unit_numel;
};

/// The master elements each unit of `engine` holds on this rank, as RankMasters keeps them: read
/// from the unit states, or where the masters live in a file between steps (NVMe parameter
/// offload) through access_optimizer, which brings them in.
template <class E>
RankMasters::Snapshot snapshot_of(E& engine) {
  RankMasters::Snapshot units;
  for (std::size_t i = 0; i < engine.unit_states().size(); ++i) {
    const auto& u = engine.unit_states()[i];
    const std::int64_t first = u.master.numel() == u.layout->padded ? 0 : u.shard_begin();
    std::vector<double> values;
    if constexpr (E::masters_resident) {
      const auto host = u.master.to_vector();
      values.assign(host.begin(), host.end());
    } else {
      engine.access_optimizer(i, [&](auto&, auto params) { values.assign(params.begin(), params.end()); });
    }
    units.emplace_back(first, std::move(values));
  }
  return units;
}

/// Records the units' layouts once the run is over.
template <class E>
void record_layout(const E& engine, RankMasters& mine) {
  for (const auto& u : engine.unit_states()) {
    auto& names = mine.layout.emplace_back();
    for (const auto& e : u.layout->entries) names.emplace_back(e.name, e.offset, e.numel());
    mine.unit_numel.push_back(u.layout->numel);
  }
}

/// Puts every rank's share together: the losses summed, the masters by name at every snapshot,
/// and the replicated elements compared across ranks.
inline Trained put_together(const std::vector<RankMasters>& ranks) {
  Trained out;
  out.losses.assign(kSteps, 0.0);
  for (const RankMasters& r : ranks)
    for (int s = 0; s < kSteps; ++s) out.losses[static_cast<std::size_t>(s)] += r.losses[static_cast<std::size_t>(s)];
  out.unit_numel = ranks[0].unit_numel;
  out.applied = ranks[0].applied;
  out.final_scale = ranks[0].final_scale;
  const auto assemble = [&](std::size_t snap) {
    Named named;
    for (std::size_t unit = 0; unit < ranks[0].layout.size(); ++unit) {
      std::vector<double> whole;
      std::vector<bool> held;
      for (const RankMasters& r : ranks) {
        const auto& [first, values] = r.snapshots[snap][unit];
        if (whole.size() < std::size_t(first) + values.size()) {
          whole.resize(std::size_t(first) + values.size());
          held.resize(whole.size());
        }
        for (std::size_t i = 0; i < values.size(); ++i) {
          const std::size_t at = std::size_t(first) + i;
          if (held[at] && std::memcmp(&whole[at], &values[i], sizeof(double)) != 0) ++out.replica_mismatches;
          whole[at] = values[i];
          held[at] = true;
        }
      }
      for (const auto& [name, offset, numel] : ranks[0].layout[unit])
        named[name] = std::vector<double>(whole.begin() + offset, whole.begin() + offset + numel);
    }
    return named;
  };
  const std::size_t snaps = ranks[0].snapshots.size();
  for (std::size_t snap = 0; snap + 1 < snaps; ++snap) out.masters_before.push_back(assemble(snap));
  out.masters = assemble(snaps - 1);
  return out;
}

/// The oracle's kSteps steps of this rank's rows of the global batch, as every run held to the
/// oracle takes them, recorded into `mine`: `loss_of(batch)` runs the model's loss on the batch
/// (moved to the model's device); the masters are snapshotted before each step unless a delayed
/// update may be writing them between steps (`between` false), and after the last; `irregular`
/// steps are taken otherwise, and every other step must be applied.
template <class E, class LossOf>
void take_oracle_steps(E& engine, LossOf&& loss_of, int rank, int world, double lr, double clip, Irregular irregular,
                       bool between, RankMasters& mine) {
  BatchSampler sampler(test::tiny_data(), 8, kBatch, 7);
  const RowRange rows = rank_rows(kBatch, rank, world);
  const double weight = double(rows.end - rows.begin) / double(kBatch);
  for (int step = 0; step < kSteps; ++step) {
    if (between) mine.snapshots.push_back(snapshot_of(engine));
    const Batch b = sampler.batch(step, rank, world);
    auto loss = engine.forward([&] { return loss_of(b); });
    mine.losses.push_back(double(float(loss.value().to_vector()[0])) * weight);
    engine.backward(loss, step == irregular.overflow ? weight * 1e30 : weight);
    loss = {};
    mine.applied.push_back(engine.step(step == irregular.zero_lr ? 0.0 : lr, clip));
    POLYSHARD_CHECK(mine.applied.back() || step == irregular.overflow, "step ", step, " was skipped");
  }
  engine.complete_delayed_update();  // StrategyConfig::delayed_parameter_update: the last step's
  mine.snapshots.push_back(snapshot_of(engine));
  mine.final_scale = engine.loss_scaler().scale();
  record_layout(engine, mine);
}

/// Trains padded_gpt() under S on `world` thread ranks for kSteps steps of the global batch, and
/// puts the fp32 master weights together from every rank's unit states, before every step and
/// after the last. Under ManualWrap each rank marks every block in its construction context.
/// `irregular`: the steps taken otherwise. Every other step must be applied.
template <class S, class Opt>
Trained train_engine(int world, typename Opt::config_type opt, double clip, StrategyConfig config = {},
                     Irregular irregular = {}) {
  std::vector<RankMasters> ranks(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    std::optional<ShardedConstruction> marks;
    if constexpr (S::wrap::manual) marks.emplace();
    Gpt<float> model(padded_gpt());
    if constexpr (S::wrap::manual)
      for (auto& block : model.transformer.h) wrap(block);
    Engine<S, Gpt<float>, ThreadCommunicator, Opt> engine(model, comm, opt, config, kSeed);
    take_oracle_steps(
        engine, [&](const Batch& b) { return model.loss(b.inputs, b.targets); }, comm.rank(), world, opt.lr, clip,
        irregular, !config.delayed_parameter_update, ranks[static_cast<std::size_t>(comm.rank())]);
  });
  return put_together(ranks);  // on the test thread
}

/// What the oracle computed for the same steps on the whole global batch.
struct Expected {
  std::vector<double> losses;
  Named masters;                 // after the last step (and the last delayed update)
  Named initial;                 // before the first step
  std::vector<Named> masters_after;  // [s]: after step s
  std::vector<Named> grads_through;  // [s]: each element's largest |reduced gradient| over steps 0 to s
  bool overflowed = false;
};

template <class P>
ReferenceTrainer reference_trainer(test::ReferenceOptimizer opt) {
  return ReferenceTrainer(padded_gpt(), kSeed, opt,
                          ReferenceRounding::of<typename P::compute_type, typename P::reduce_type,
                                                typename P::master_type>(P::loss_scale::initial_scale));
}

inline Named to_named(std::vector<std::pair<std::string, std::vector<double>>> values) {
  return Named(std::make_move_iterator(values.begin()), std::make_move_iterator(values.end()));
}

/// `delayed`: each step's gradient applied at the next step (ZeRO-Offload's delayed parameter
/// update), the last one after the run. `skipped`: a step whose batch is drawn and not trained on,
/// as an engine skips a step whose gradients overflowed.
template <class P>
Expected train_reference(test::ReferenceOptimizer opt, double lr, double clip, bool delayed = false,
                         int skipped = -1) {
  ReferenceTrainer reference = reference_trainer<P>(opt);
  if (delayed) reference.delay_updates();
  BatchSampler sampler(test::tiny_data(), 8, kBatch, 7);
  Expected out;
  out.initial = to_named(reference.parameters());
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = sampler.batch(step, 0, 1);
    out.losses.push_back(step == skipped ? reference.loss(batch) : reference.step(batch, lr, clip));
    out.masters_after.push_back(to_named(reference.parameters()));
    out.grads_through.push_back(to_named(reference.largest_abs_grads()));
  }
  reference.flush();
  out.masters = to_named(reference.parameters());
  out.overflowed = reference.overflowed();
  return out;
}

/// The oracle's loss of step `step`'s global batch at master weights `masters`.
template <class P>
double reference_loss(test::ReferenceOptimizer opt, const Named& masters, int step) {
  ReferenceTrainer reference = reference_trainer<P>(opt);
  BatchSampler sampler(test::tiny_data(), 8, kBatch, 7);
  return reference.loss_at(masters, sampler.batch(step, 0, 1));
}

/// Largest |engine - oracle| over every master weight; every name must be on both sides.
inline double max_master_difference(const Trained& run, const Expected& expected) {
  REQUIRE(run.masters.size() == expected.masters.size());
  return max_named_difference(run.masters, expected.masters);
}

/// The unit roundoff of element type X: half the distance from 1 to the next value.
template <class X>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<X, bfloat16>) return 0x1p-8;  // 7 stored mantissa bits
  else if constexpr (std::is_same_v<X, half>) return 0x1p-11;  // 10 stored mantissa bits
  else return 0x1p-24;
}


/// The largest |engine - oracle| a master weight of a run under precision policy P may show after
/// `steps` steps of SGD with momentum (lr) at world size `world`. fp32: 1e-6, float against
/// double in forward, backward and the reduction's sums, each within float's unit roundoff (6e-8)
/// times the small sums of this model. 16-bit (u: the format's unit roundoff, W: the world size,
/// G: the largest reduced-gradient element of the weight's own tensor over those steps, w: the
/// weight's largest magnitude over them, n: the steps):
/// - each step's reduced gradient differs from the oracle's by at most (W + 1) u G: every rank
///   rounds its share to the reduce dtype and the sum is rounded again, where the oracle rounds
///   the exact sum once; and by 2 u G more where a compute-dtype weight rounded to the other
///   neighbour (the masters differ slightly), one ulp being 2u relative: (W + 3) u G in all;
/// - momentum carries a gradient error into every later step: the weights move by
///   lr * sum_t sum_{k<=t} momentum^(t-k) g_k, at most lr * n (n + 1) / 2 times the error;
/// - 16-bit masters (PureBf16) may each round to the other neighbour once per step: n * 2 u w.
/// Plus 1e-6 for the fp32 arithmetic around it. Scaling by the tensor's own gradient, not the
/// model's largest, keeps the bound below every tensor's movement (check_sharp proves it).
/// `activations_16bit`: the model also keeps its activations in the compute type (a model of
/// bfloat16 or half on a GPU; the host's models compute in float from 16-bit weights), which the
/// oracle does not: each gradient element then carries up to 8 u G more, the roundings of the
/// activations and of the gradients flowing back through this model's layers (2.1 u G measured
/// on the emulated GPU in bf16, 0.9 u G in fp16).
template <class P>
double element_tolerance(double tensor_grad, double weight, int steps, int world, double lr,
                         bool activations_16bit = false) {
  using CT = typename P::compute_type;
  if constexpr (std::is_same_v<CT, float> && std::is_same_v<typename P::master_type, float>) {
    return 1e-6;
  } else {
    const double u = unit_roundoff<CT>();
    const double n = steps;
    const bool master_16bit = !std::is_same_v<typename P::master_type, float>;
    const double per_step = (world + 3 + (activations_16bit ? 8 : 0)) * u * tensor_grad;
    return lr * per_step * n * (n + 1) / 2 + (master_16bit ? n * 2 * u * std::abs(weight) : 0.0) + 1e-6;
  }
}

/// A weight farther from the oracle's than its tolerance: the first such element of its tensor.
struct Excess {
  std::string name;
  std::size_t index = 0;
  double difference = 0, tolerance = 0;
  bool operator==(const Excess&) const = default;
};

inline std::ostream& operator<<(std::ostream& out, const Excess& e) {
  return out << e.name << "[" << e.index << "]: " << e.difference << " from the oracle, tolerance " << e.tolerance;
}

/// Every tensor of `got`, the masters after `steps` steps (1 to kSteps; at kSteps, after the last
/// delayed update too), with an element farther from the oracle's than element_tolerance allows.
template <class P>
std::vector<Excess> excesses(const Named& got, const Expected& expected, int steps, int world, double lr,
                             bool activations_16bit = false) {
  const std::size_t s = static_cast<std::size_t>(steps - 1);
  const Named& want = steps == kSteps ? expected.masters : expected.masters_after.at(s);
  std::vector<Excess> out;
  for (const auto& [name, values] : want) {
    const auto it = got.find(name);
    REQUIRE(it != got.end());
    REQUIRE(it->second.size() == values.size());
    const std::vector<double>& grads = expected.grads_through.at(s).at(name);
    const double tensor_grad = *std::max_element(grads.begin(), grads.end());
    std::vector<const std::vector<double>*> path{&expected.initial.at(name)};  // the oracle's weights, step by step
    for (std::size_t k = 0; k <= s; ++k) path.push_back(&expected.masters_after[k].at(name));
    for (std::size_t i = 0; i < values.size(); ++i) {
      double weight = std::abs(values[i]);
      for (const std::vector<double>* w : path) weight = std::max(weight, std::abs((*w)[i]));
      const double tolerance = element_tolerance<P>(tensor_grad, weight, steps, world, lr, activations_16bit);
      const double difference = std::abs(it->second[i] - values[i]);
      if (!(difference <= tolerance)) {
        out.push_back({name, i, difference, tolerance});
        break;
      }
    }
  }
  return out;
}

/// The loss a run reports is its forward in float of the weights it holds: the oracle's double
/// forward of the same (compute-dtype) weights, within float's rounding of these small sums.
/// With activations in a 16-bit compute type, the loss is itself such a value (u) and the
/// forward's roundings add as much again (0.7 u measured in bf16): 2u relative.
template <class P>
bool same_loss(double reported, double oracle, bool activations_16bit = false) {
  const double relative = activations_16bit ? 2 * unit_roundoff<typename P::compute_type>() : 1e-6;
  return std::abs(reported - oracle) <= relative * std::abs(oracle);
}

/// A run of S held to the oracle at world size `world`:
/// - its masters within element_tolerance of the oracle's after every step (after the last only
///   under a delayed update, whose masters are still being written between steps);
/// - every loss the oracle's loss at the weights the run computed it with (same_loss);
/// - every rank's copy of a replicated unit the same, bit for bit.
template <class P>
void check_run(const Trained& run, const Expected& expected, test::ReferenceOptimizer opt, int world, double lr,
               bool activations_16bit = false) {
  CHECK(run.replica_mismatches == 0);
  CHECK(excesses<P>(run.masters, expected, kSteps, world, lr, activations_16bit) == std::vector<Excess>{});
  REQUIRE(run.losses.size() == std::size_t(kSteps));
  if (run.masters_before.empty()) return;
  REQUIRE(run.masters_before.size() == std::size_t(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s);
    if (s > 0)
      CHECK(excesses<P>(run.masters_before[std::size_t(s)], expected, s, world, lr, activations_16bit) ==
            std::vector<Excess>{});
    const double oracle = reference_loss<P>(opt, run.masters_before[std::size_t(s)], s);
    CHECK(same_loss<P>(run.losses[std::size_t(s)], oracle, activations_16bit));
  }
}

/// The controls that show check_run's tolerances tell training from no training on this run:
/// - every tensor the oracle moves fails the check when it is left at its initial values, as a
///   run that never updated it would leave it (the other tensors as this run trained them);
/// - a tensor the oracle leaves where it was, every update rounded away, occurs only under 16-bit
///   master weights (no check could see a missing update there: the oracle misses it too);
/// - every loss after the first differs, beyond same_loss, from the loss of the weights one step
///   behind. Not with 16-bit activations: a bf16 loss near 2.6 has an ulp of 0.016, and two steps
///   of this test lower the loss of a batch by 0.006, so the weights are what shows training there.
template <class P>
void check_sharp(const Trained& run, const Expected& expected, test::ReferenceOptimizer opt, int world, double lr,
                 bool activations_16bit = false) {
  REQUIRE(run.masters_before.size() == std::size_t(kSteps));
  const Named& initial = run.masters_before.front();
  for (const auto& [name, values] : expected.masters) {
    INFO(name << " left at its initial values");
    if (values == expected.initial.at(name)) {
      CHECK(!std::is_same_v<typename P::master_type, float>);
      continue;
    }
    Named frozen = run.masters;
    frozen[name] = initial.at(name);
    const std::vector<Excess> found = excesses<P>(frozen, expected, kSteps, world, lr, activations_16bit);
    CHECK(std::any_of(found.begin(), found.end(), [&](const Excess& e) { return e.name == name; }));
  }
  if (activations_16bit) return;
  for (int s = 1; s < kSteps; ++s) {
    INFO("step " << s << "'s loss at the weights of step " << s - 1);
    const double behind = reference_loss<P>(opt, run.masters_before[std::size_t(s - 1)], s);
    CHECK_FALSE(same_loss<P>(run.losses[std::size_t(s)], behind));
  }
}

}  // namespace polyshard::test::oracle
