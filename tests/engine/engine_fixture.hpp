// Shared set-up of the engine tests: a small GPT whose unit sizes do not divide by the world
// size, a fixed data stream, and a runner that trains it under a strategy on N thread ranks.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>

#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/data/data.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "polyshard/policy/policy.hpp"

namespace polyshard::test {

inline GptConfig tiny_gpt() { return {.vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 6}; }

inline const TextDataset& tiny_data() {
  static const TextDataset data = [] {
    std::vector<std::int32_t> tokens(500);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::int32_t(splitmix64(i) % 13);
    return TextDataset(std::move(tokens), "tiny");
  }();
  return data;
}

using Parameters = std::vector<std::pair<std::string, std::vector<float>>>;

/// The library's sharding policies with one unit per transformer block (the presets wrap by size).
using DdpPerBlock = Strategy<NoShard, WrapByType<Block>>;
using ZeRO2PerBlock = Strategy<ShardGradients, WrapByType<Block>>;
using FsdpPerBlock = Strategy<ShardParameters<true>, WrapByType<Block>>;
using GradOpPerBlock = Strategy<ShardParameters<false>, WrapByType<Block>>;
using ZeRO3Checkpointed = Strategy<ShardParameters<true>, WrapByType<Block>, ActivationCheckpointing<Block>>;

/// What one rank saw of a training run.
struct RunResult {
  Parameters parameters;          // after the last step, gathered
  std::vector<double> losses;     // the global mean loss of each step (summed over ranks)
  double bytes_sent = 0;          // by this rank in the last step, over every communicator
  /// Per collective kind, (bytes moved, measured; bytes sent, the ring formula's prediction) in
  /// the last step: this rank's from train_rank, every rank's summed from train.
  std::map<CollectiveKind, std::pair<double, double>> traffic;
  std::map<CollectiveKind, std::uint64_t> calls;  // per kind in the last step, counted as traffic is
  std::int64_t model_state = 0;   // parameters + gradients + optimizer state, after the last step
  std::int64_t padded = 0, root_padded = 0;
  /// This rank's shards in all where they are uneven (UnitPlan::uneven_shards), else -1.
  std::int64_t rank_shard = -1;
};

/// SGD with momentum: linear in the gradients, so runs that differ only in the order of
/// floating-point sums stay within rounding of each other (Adam's normalisation would magnify
/// the rounding of near-zero gradients into whole updates).
inline SgdConfig momentum_sgd() { return {.lr = 0.1, .momentum = 0.9}; }

/// Catch2 assertions are not thread-safe: rank bodies only compute, and the test thread checks.

/// Trains tiny_gpt() for `steps` steps of global batch `batch` under S on this rank of `comm`
/// with optimizer `Opt`; returns what this rank saw (the losses are its weighted share).
template <class S, class Opt = Sgd<float>, class Comm>
RunResult train_rank(Comm& comm, int steps = 3, std::int64_t batch = 6, typename Opt::config_type opt = momentum_sgd(),
                     double clip = std::numeric_limits<double>::infinity(), StrategyConfig config = {}) {
  RunResult result;
  const int world = comm.size();
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  Gpt<float> model(tiny_gpt());
  Engine<S, Gpt<float>, Comm, Opt> engine(model, comm, opt, config, 42);
  BatchSampler sampler(tiny_data(), 8, batch, 7);
  const RowRange rows = rank_rows(batch, comm.rank(), world);
  const double weight = double(rows.end - rows.begin) / double(batch);
  for (int step = 0; step < steps; ++step) {
    engine.reset_stats();
    const Batch b = sampler.batch(step, comm.rank(), world);
    POLYSHARD_CHECK(b.inputs.size(0) > 0, "train: every rank needs rows (batch >= world)");
    Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
    result.losses.push_back(loss.value().data()[0] * weight);
    engine.backward(loss, weight);
    loss = Var<float>();
    engine.step(opt.lr, clip);
  }
  // Of the last step, before gathering parameters for the check; every communicator's, the
  // hybrid groups' too.
  const CommStats traffic = engine.traffic();
  result.bytes_sent = traffic.total_bytes_sent();
  for (const CollectiveKind k : {CollectiveKind::AllReduce, CollectiveKind::ReduceScatter, CollectiveKind::AllGather,
                                 CollectiveKind::Broadcast, CollectiveKind::Reduce}) {
    result.traffic[k] = {traffic.bytes_moved(k), traffic.bytes_sent(k)};
    result.calls[k] = traffic.calls(k);
  }
  result.model_state = tracker.current(MemoryCategory::Parameters) + tracker.current(MemoryCategory::Gradients) +
                       tracker.current(MemoryCategory::OptimizerState);
  result.parameters = engine.full_parameters();
  result.padded = engine.units().padded_total();
  result.root_padded = engine.units().units[0].padded;
  result.rank_shard =
      rank_shard_elements(engine.units().uneven_shards(engine.shard_comm().rank(), engine.shard_comm().size()));
  return result;
}

/// train_rank on `world` thread ranks: rank 0's view, with each step's loss summed over ranks
/// (the global mean loss).
template <class S, class Opt = Sgd<float>>
RunResult train(int world, int steps = 3, std::int64_t batch = 6, typename Opt::config_type opt = momentum_sgd(),
                double clip = std::numeric_limits<double>::infinity(), StrategyConfig config = {}) {
  std::vector<RunResult> results(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    results[static_cast<std::size_t>(comm.rank())] = train_rank<S, Opt>(comm, steps, batch, opt, clip, config);
  });
  RunResult result = std::move(results[0]);
  for (std::size_t r = 1; r < results.size(); ++r) {
    for (std::size_t i = 0; i < result.losses.size(); ++i) result.losses[i] += results[r].losses[i];
    for (auto& [kind, bytes] : result.traffic) {
      bytes.first += results[r].traffic[kind].first;
      bytes.second += results[r].traffic[kind].second;
    }
    for (auto& [kind, calls] : result.calls) calls += results[r].calls[kind];
  }
  return result;
}

/// Largest absolute difference between two parameter sets with the same names.
/// Largest |got - expected| over every parameter `expected` names, each named in `got` too with
/// as many elements: ranges of (name, values) pairs, a map or a vector, of any element types.
template <class Got, class Expected>
double max_named_difference(const Got& got, const Expected& expected) {
  double worst = 0;
  for (const auto& [name, values] : expected) {
    INFO(name);
    const auto it = std::find_if(got.begin(), got.end(), [&](const auto& p) { return p.first == name; });
    REQUIRE(it != got.end());
    REQUIRE(it->second.size() == values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      worst = std::max(worst, std::abs(double(it->second[i]) - double(values[i])));
  }
  return worst;
}

/// Each parameter of `flat` by name, in name order, its values read from `values` (the flat
/// buffer of an oracle's weights).
inline Parameters by_name(const FlatParameters<float>& flat, const Tensor<float>& values) {
  Parameters out;
  for (const auto& e : flat.entries()) {
    const auto s = values.flat_view(e.offset, e.numel()).span();
    out.emplace_back(e.name, std::vector<float>(s.begin(), s.end()));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

/// A one-process oracle without the engine: tiny_gpt() on flat buffers (seed 42), `steps` steps
/// of the fixture's batches (global batch 6), AdamW run parameter by parameter with the config
/// `config_of(step, entry)` points at, none for a parameter the step leaves alone, values and
/// state (torch's rule for a parameter without a gradient). `prepare(model, step)` runs before
/// each step. The parameters at the end, by name.
template <class Prepare, class ConfigOf>
Parameters adamw_by_parameter(int steps, Prepare&& prepare, ConfigOf&& config_of) {
  Gpt<float> model(tiny_gpt());
  FlatParameters<float> flat(model);
  flat.initialize(42);
  Tensor<float> values = flat.values(), grads = flat.grads();
  const auto n = flat.padded_numel();
  Tensor<float> exp_avg = Tensor<float>::zeros({n}), exp_avg_sq = Tensor<float>::zeros({n});
  BatchSampler sampler(tiny_data(), 8, 6, 7);
  for (int step = 0; step < steps; ++step) {
    prepare(model, step);
    flat.zero_grad();
    const Batch b = sampler.batch(step);
    backward(model.loss(b.inputs, b.targets));
    flat.settle_grads();
    for (const auto& e : flat.entries()) {
      const AdamWConfig* config = config_of(step, e);
      if (config == nullptr) continue;
      const auto slice = [&](const Tensor<float>& t) { return t.flat_view(e.offset, e.numel()).span(); };
      adam_update<float, float>(slice(values), slice(grads), slice(exp_avg), slice(exp_avg_sq), *config, step + 1,
                                true);
    }
  }
  return by_name(flat, values);
}

/// adamw_by_parameter with `config` for every parameter, or, when `matrices_only`, without
/// weight decay for those decay_matrices_only() exempts (biases and norms).
inline Parameters adamw_matrices_only(int steps, const AdamWConfig& config, bool matrices_only) {
  AdamWConfig exempt = config;
  exempt.weight_decay = 0;
  return adamw_by_parameter(
      steps, [&](Gpt<float>& model, int step) { if (matrices_only && step == 0) decay_matrices_only(model); },
      [&](int, const auto& e) { return e.parameter->has_weight_decay() ? &config : &exempt; });
}

inline double max_difference(const Parameters& a, const Parameters& b) {
  double worst = 0;
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].first == b[i].first);
    REQUIRE(a[i].second.size() == b[i].second.size());
    for (std::size_t j = 0; j < a[i].second.size(); ++j)
      worst = std::max(worst, double(std::abs(a[i].second[j] - b[i].second[j])));
  }
  return worst;
}

}  // namespace polyshard::test
