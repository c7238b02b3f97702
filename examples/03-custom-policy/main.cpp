// Policies of one's own: a precision policy, a wrap policy and a sharding policy with its engine
// behaviour (split_all_reduce.hpp), composed with the library's policies into strategies and
// trained on three thread ranks beside plain DDP. Exits 1 unless each ends where DDP ends.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <polyshard/comm/thread_communicator.hpp>
#include <polyshard/data/data.hpp>
#include <polyshard/engine/engine.hpp>
#include <polyshard/nn/nn.hpp>
#include <polyshard/optim/optim.hpp>
#include <polyshard/policy/policy.hpp>

#include "split_all_reduce.hpp"

using namespace polyshard;

// [precision]
/// fp16 parameters for compute, gradients reduced in fp32 (FSDP's fp32_reduce_scatter), fp32
/// master weights, and a static loss scale of 2^12 in place of Fp16Mixed's dynamic one.
struct Fp16Fp32Reduce : MixedPrecision<half, float, float, StaticLossScale<12>> {
  static constexpr const char* name = "Fp16Fp32Reduce";
};
static_assert(PrecisionPolicy<Fp16Fp32Reduce>);
// [precision]

// [wrap]
/// Every module with a residual projection `c_proj` (each block's attention and MLP) is a unit
/// of its own: a predicate on the module's type, which WrapByType and WrapByClass (lists of names)
/// cannot express.
struct WrapResidualBranches {
  using family = wrap_family;
  template <class M>
  static constexpr bool wraps_type = requires(const M& m) { m.c_proj; };
  static constexpr std::int64_t min_num_params = 0;  // no size-based wrapping
  static constexpr bool manual = false;              // no wrap() calls
  static constexpr const char* name = "WrapResidualBranches";
};
static_assert(WrapPolicy<WrapResidualBranches>);
static_assert(WrapResidualBranches::wraps_type<Mlp<float>> && WrapResidualBranches::wraps_type<CausalSelfAttention<float>>);
static_assert(!WrapResidualBranches::wraps_type<Block<float>> && !WrapResidualBranches::wraps_type<Linear<float>>);
// [wrap]

// [compose]
// ZeRO-3 over the residual branches in fp16 with fp32 reduction; and DDP reduced in two halves.
// Policies go in any order; families left out take their defaults.
using Zero3Fp16 = Strategy<WrapResidualBranches, Fp16Fp32Reduce, ShardParameters<true>>;
using SplitDdp = Strategy<SplitAllReduce>;

static_assert(std::is_same_v<Zero3Fp16::compute_type, half> && std::is_same_v<Zero3Fp16::reduce_type, float>);
static_assert(std::is_same_v<Zero3Fp16::offload, NoOffload>);
static_assert(std::is_same_v<with_t<Zero3Fp16, ShardGradients>::wrap, WrapResidualBranches>);
// [compose]

namespace {

using Parameters = std::vector<std::pair<std::string, std::vector<float>>>;

/// What rank 0 saw of a run.
struct Run {
  Parameters parameters;             // after the last step, gathered, by name
  std::size_t units = 0;             // units the wrap policy cut the model into
  double bytes_sent = 0;             // by rank 0 in the last step
  double all_reduce_bytes = 0;       // the part of it sent by all-reduces
  double bytes_expected = 0;         // what policy/accounting.hpp says for the strategy
};

const GptConfig config{.vocab_size = 256, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 24};

// [train]
/// Trains a small GPT for a few steps under strategy S on `world` thread ranks; SGD with
/// momentum, whose update is linear in the gradients, so strategies can be compared closely.
template <class S>
Run train(int world) {
  static const TextDataset data = TextDataset::from_text(builtin_corpus(1 << 14));
  const std::int64_t global_batch = 6;
  Run run;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(config);
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, SgdConfig{.lr = 0.1, .momentum = 0.9});
    const BatchSampler sampler(data, config.block_size, global_batch, /*seed=*/3);
    const RowRange rows = rank_rows(global_batch, comm.rank(), comm.size());
    const double share = double(rows.end - rows.begin) / double(global_batch);
    for (int step = 0; step < 4; ++step) {
      engine.reset_stats();
      const Batch b = sampler.batch(step, comm.rank(), comm.size());
      engine.zero_grad();
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, share);
      engine.step(0.1);
    }
    const double sent = engine.bytes_sent(), sent_by_all_reduce = engine.bytes_sent(CollectiveKind::AllReduce);
    Parameters parameters = engine.full_parameters();  // a collective: every rank calls it
    if (comm.rank() == 0) {
      run.parameters = std::move(parameters);
      run.units = engine.units().units.size();
      run.bytes_sent = sent;
      run.all_reduce_bytes = sent_by_all_reduce;
      run.bytes_expected =
          bytes_sent_per_step<S>(engine.units().padded_total(), engine.units().units[0].padded, comm.size());
    }
  });
  return run;
}
// [train]

double max_difference(const Parameters& a, const Parameters& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a[i].second.size(); ++j)
      worst = std::max(worst, double(std::abs(a[i].second[j] - b[i].second[j])));
  return worst;
}

/// Prints one strategy's figures against DDP's; false when a check fails.
bool report(const char* name, const Run& run, const Run& ddp, std::size_t units, double tolerance,
            bool all_reduces = true) {
  const bool same_names = run.parameters.size() == ddp.parameters.size() &&
                          std::equal(run.parameters.begin(), run.parameters.end(), ddp.parameters.begin(),
                                     [](const auto& x, const auto& y) { return x.first == y.first; });
  const double diff = same_names ? max_difference(run.parameters, ddp.parameters) : std::numeric_limits<double>::infinity();
  const bool ok = same_names && diff <= tolerance && run.units == units &&
                  std::abs(run.bytes_sent - run.bytes_expected) <= 1e-9 * run.bytes_expected &&
                  (all_reduces || run.all_reduce_bytes == 0);
  std::printf("%-10s units %zu (want %zu)  bytes sent %.0f (accounting says %.0f; %.0f by all-reduce)  "
              "max |param - DDP's| %.3g (within %.0e)  %s\n",
              name, run.units, units, run.bytes_sent, run.bytes_expected, run.all_reduce_bytes, diff, tolerance,
              ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main() {
  const int world = 3;
  const Run ddp = train<DDP>(world);
  const Run zero3 = train<Zero3Fp16>(world);
  const Run split = train<SplitDdp>(world);
  const auto branches = static_cast<std::size_t>(1 + 2 * config.n_layer);  // the root, attn and mlp per block
  bool ok = report("DDP", ddp, ddp, 1, 0.0);
  // fp16 parameters: half of fp16's spacing at 1 is 2^-11, about 5e-4, and training adds a little.
  ok = report("Zero3Fp16", zero3, ddp, branches, 2e-3) && ok;
  // The two halves of the ring all-reduce add in the same order: the same bits.
  // and no all-reduce runs: SplitAllReduce's behaviour, not NoShard's, did the reduction.
  ok = report("SplitDdp", split, ddp, 1, 0.0, /*all_reduces=*/false) && ok;
  std::printf("%s\n", ok ? "custom policies: every check passed" : "custom policies: a check FAILED");
  return ok ? 0 : 1;
}
