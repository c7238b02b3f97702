// The oracle comparison shared by the engine tests that train against tests/support's reference
// trainer: a test model whose units divide by no world size from 2 to 8, a run of any strategy on
// thread ranks that reads back the fp32 master weights (not through Engine::full_parameters(),
// which the strategies under test share), and the tolerances of 16-bit precision derived below.
#pragma once

#include <catch2/catch.hpp>

#include <map>
#include <optional>
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

/// What a run left: each step's global mean loss, and the master weights by parameter name.
struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> masters;
  std::vector<std::int64_t> unit_numel;  // parameters per unit, unpadded
};

/// One rank's share: its losses (weighted by its rows) and the master elements it holds.
struct RankMasters {
  std::vector<double> losses;
  std::vector<std::pair<std::int64_t, std::vector<double>>> per_unit;  // (first element, values)
  std::vector<std::vector<std::tuple<std::string, std::int64_t, std::int64_t>>> layout;  // (name, offset, numel)
  std::vector<std::int64_t> unit_numel;
};

/// Trains padded_gpt() under S on `world` thread ranks for kSteps steps of the global batch, and
/// puts the fp32 master weights together from every rank's unit states. Under ManualWrap each
/// rank marks every block in its construction context.
template <class S, class Opt>
Trained train_engine(int world, typename Opt::config_type opt, double clip, StrategyConfig config = {}) {
  std::vector<RankMasters> ranks(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    RankMasters& mine = ranks[static_cast<std::size_t>(comm.rank())];
    std::optional<ShardedConstruction> marks;
    if constexpr (S::wrap::manual) marks.emplace();
    Gpt<float> model(padded_gpt());
    if constexpr (S::wrap::manual)
      for (auto& block : model.transformer.h) wrap(block);
    Engine<S, Gpt<float>, ThreadCommunicator, Opt> engine(model, comm, opt, config, kSeed);
    BatchSampler sampler(test::tiny_data(), 8, kBatch, 7);
    const RowRange rows = rank_rows(kBatch, comm.rank(), world);
    const double weight = double(rows.end - rows.begin) / double(kBatch);
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      mine.losses.push_back(double(loss.value().data()[0]) * weight);
      engine.backward(loss, weight);
      loss = Var<float>();
      POLYSHARD_CHECK(engine.step(opt.lr, clip), "a step was skipped: the comparison assumes none is");
    }
    engine.complete_delayed_update();  // StrategyConfig::delayed_parameter_update: the last step's
    for (const auto& u : engine.unit_states()) {
      const auto values = u.master.to_vector();
      const std::int64_t first = u.master.numel() == u.layout->padded ? 0 : u.shard_begin();
      mine.per_unit.emplace_back(first, std::vector<double>(values.begin(), values.end()));
      auto& names = mine.layout.emplace_back();
      for (const auto& e : u.layout->entries) names.emplace_back(e.name, e.offset, e.numel());
      mine.unit_numel.push_back(u.layout->numel);
    }
  });
  // The test thread puts the units together from every rank's elements.
  Trained out;
  out.losses.assign(kSteps, 0.0);
  for (const RankMasters& r : ranks)
    for (int s = 0; s < kSteps; ++s) out.losses[static_cast<std::size_t>(s)] += r.losses[static_cast<std::size_t>(s)];
  out.unit_numel = ranks[0].unit_numel;
  for (std::size_t unit = 0; unit < ranks[0].layout.size(); ++unit) {
    std::vector<double> whole;
    for (const RankMasters& r : ranks) {
      const auto& [first, values] = r.per_unit[unit];
      if (whole.size() < std::size_t(first) + values.size()) whole.resize(std::size_t(first) + values.size());
      std::copy(values.begin(), values.end(), whole.begin() + first);
    }
    for (const auto& [name, offset, numel] : ranks[0].layout[unit])
      out.masters[name] = std::vector<double>(whole.begin() + offset, whole.begin() + offset + numel);
  }
  return out;
}

/// What the oracle computed for the same steps on the whole global batch.
struct Expected {
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<double>>> masters;
  double largest_grad = 0;  // the largest gradient element of any step
  double moved = 0;         // the largest change of a weight over the run: what the tolerances are against
  bool overflowed = false;
};

/// `delayed`: each step's gradient applied at the next step (ZeRO-Offload's delayed parameter
/// update), the last one after the run.
template <class P>
Expected train_reference(test::ReferenceOptimizer opt, double lr, double clip, bool delayed = false) {
  ReferenceTrainer reference(padded_gpt(), kSeed, opt,
                             ReferenceRounding::of<typename P::compute_type, typename P::reduce_type,
                                                   typename P::master_type>(P::loss_scale::initial_scale));
  if (delayed) reference.delay_updates();
  BatchSampler sampler(test::tiny_data(), 8, kBatch, 7);
  Expected out;
  const auto initial = reference.parameters();
  for (int step = 0; step < kSteps; ++step) out.losses.push_back(reference.step(sampler.batch(step, 0, 1), lr, clip));
  reference.flush();
  out.masters = reference.parameters();
  for (std::size_t p = 0; p < initial.size(); ++p)
    for (std::size_t i = 0; i < initial[p].second.size(); ++i)
      out.moved = std::max(out.moved, std::abs(out.masters[p].second[i] - initial[p].second[i]));
  out.largest_grad = reference.largest_grad();
  out.overflowed = reference.overflowed();
  return out;
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
/// kSteps steps of SGD with momentum (lr) at world size `world`. fp32: 1e-6, float against
/// double in forward, backward and the reduction's sums, each within float's unit roundoff (6e-8)
/// times the small sums of this model. 16-bit (u: the format's unit roundoff, W: the world size,
/// G: the oracle's largest gradient element, w: its largest weight, n: the steps):
/// - each step's reduced gradient differs from the oracle's by at most (W + 1) u G: every rank
///   rounds its share to the reduce dtype and the sum is rounded again, where the oracle rounds
///   the exact sum once; and by 2 u G more where a compute-dtype weight rounded to the other
///   neighbour (the masters differ slightly), one ulp being 2u relative: (W + 3) u G in all;
/// - momentum carries a gradient error into every later step: the weights move by
///   lr * sum_t sum_{k<=t} momentum^(t-k) g_k, at most lr * n (n + 1) / 2 times the error;
/// - 16-bit masters (PureBf16) may each round to the other neighbour once per step: n * 2 u w.
/// Plus 1e-6 for the fp32 arithmetic around it.
template <class P>
double sgd_tolerance(const Expected& expected, int world, double lr) {
  using CT = typename P::compute_type;
  if constexpr (std::is_same_v<CT, float> && std::is_same_v<typename P::master_type, float>) {
    return 1e-6;
  } else {
  double largest_weight = 0;
  for (const auto& [name, values] : expected.masters)
    for (double w : values) largest_weight = std::max(largest_weight, std::abs(w));
  const double u = unit_roundoff<CT>();
  const double n = kSteps;
  const bool master_16bit = !std::is_same_v<typename P::master_type, float>;
  return lr * (world + 3) * u * expected.largest_grad * n * (n + 1) / 2 + (master_16bit ? n * 2 * u * largest_weight : 0.0) +
         1e-6;
  }
}

}  // namespace polyshard::test::oracle
