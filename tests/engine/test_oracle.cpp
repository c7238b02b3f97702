// Every strategy against the oracle outside the engine (tests/support/reference_trainer.hpp):
// one process, the whole model in double, PyTorch's optimizer formulas. The model's units
// (299 and 2,197 parameters) divide by no world size from 2 to 8, so every sharded run pads;
// the fp32 master weights of every strategy are compared, read from each rank's unit states
// (not through Engine::full_parameters(), which the strategies under test share).
#include <catch2/catch.hpp>

#include <map>

#include "engine_fixture.hpp"
#include "support/reference_trainer.hpp"

using namespace polyshard;
using test::ReferenceRounding;
using test::ReferenceTrainer;
using test::DdpPerBlock;
using test::FsdpPerBlock;
using test::GradOpPerBlock;
using test::ZeRO2PerBlock;
using test::ZeRO3Checkpointed;

namespace {

/// 13 channels and a 23-row root (13 tokens, 8 positions, the final norm's 2): the root has
/// 13 * 23 = 299 parameters and each block 12 * 13^2 + 13 * 13 = 2,197 = 13^3, neither
/// divisible by 2, 3, 4, 5, 6, 7 or 8.
GptConfig padded_gpt() { return {.vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = 1, .n_embd = 13}; }

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

template <class S, class Opt>
Trained train_engine(int world, typename Opt::config_type opt, double clip) {
  std::vector<RankMasters> ranks(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    RankMasters& mine = ranks[static_cast<std::size_t>(comm.rank())];
    Gpt<float> model(padded_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Opt> engine(model, comm, opt, {}, kSeed);
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

template <class P>
Expected train_reference(test::ReferenceOptimizer opt, double lr, double clip) {
  ReferenceTrainer reference(padded_gpt(), kSeed, opt,
                             ReferenceRounding::of<typename P::compute_type, typename P::reduce_type,
                                                   typename P::master_type>(P::loss_scale::initial_scale));
  BatchSampler sampler(test::tiny_data(), 8, kBatch, 7);
  Expected out;
  const auto initial = reference.parameters();
  for (int step = 0; step < kSteps; ++step) out.losses.push_back(reference.step(sampler.batch(step, 0, 1), lr, clip));
  out.masters = reference.parameters();
  for (std::size_t p = 0; p < initial.size(); ++p)
    for (std::size_t i = 0; i < initial[p].second.size(); ++i)
      out.moved = std::max(out.moved, std::abs(out.masters[p].second[i] - initial[p].second[i]));
  out.largest_grad = reference.largest_grad();
  out.overflowed = reference.overflowed();
  return out;
}

/// Largest |engine - oracle| over every master weight; every name must be on both sides.
double max_master_difference(const Trained& run, const Expected& expected) {
  double worst = 0;
  REQUIRE(run.masters.size() == expected.masters.size());
  for (const auto& [name, values] : expected.masters) {
    INFO(name);
    const auto it = run.masters.find(name);
    REQUIRE(it != run.masters.end());
    REQUIRE(it->second.size() == values.size());
    for (std::size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::abs(it->second[i] - values[i]));
  }
  return worst;
}

using ZeRO3Offload = Strategy<ShardParameters<true>, OffloadParameters<Cpu>, WrapByType<Block>>;
using OracleFp32 = std::tuple<DDP, DdpPerBlock, ZeRO<1>, ZeRO<2>, ZeRO2PerBlock, ZeRO<3>, FsdpPerBlock, GradOpPerBlock,
                              ZeRO3Checkpointed, ZeROOffload, ZeRO3Offload>;

}  // namespace

TEMPLATE_LIST_TEST_CASE("oracle: every fp32 strategy at world sizes 1 to 8 ends on one double-precision process",
                        "[engine][oracle]", OracleFp32) {
  const SgdConfig sgd = test::momentum_sgd();
  const Expected expected = train_reference<Fp32>(sgd, sgd.lr, std::numeric_limits<double>::infinity());
  CHECK(expected.moved > 1e-2);  // training moves weights by four orders of magnitude more than the tolerance
  for (int world = 1; world <= 8; ++world) {
    INFO("world size " << world);
    const Trained run = train_engine<TestType, Sgd<float>>(world, sgd, std::numeric_limits<double>::infinity());
    for (const std::int64_t n : run.unit_numel)
      if (world > 1) CHECK(n % world != 0);  // every unit pads
    // fp32 against double: float arithmetic in forward, backward and the sums of the reduction,
    // each within float's unit roundoff (6e-8) times the small sums of this model.
    CHECK(max_master_difference(run, expected) < 1e-6);
    for (int s = 0; s < kSteps; ++s)
      CHECK(run.losses[std::size_t(s)] == Approx(expected.losses[std::size_t(s)]).epsilon(1e-6));
  }
}

namespace {

template <class P>
using Mixed = std::tuple<Strategy<NoShard, P>, Strategy<ShardGradients, P>, Strategy<ShardParameters<true>, WrapByType<Block>, P>,
                         Strategy<ShardGradients, OffloadOptimizer<Cpu>, P>>;
using OracleMixed = decltype(std::tuple_cat(Mixed<Bf16Mixed>(), Mixed<Fp16Mixed>(), Mixed<PureBf16>()));

/// The unit roundoff of element type X: half the distance from 1 to the next value.
template <class X>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<X, bfloat16>) return 0x1p-8;  // 7 stored mantissa bits
  else if constexpr (std::is_same_v<X, half>) return 0x1p-11;  // 10 stored mantissa bits
  else return 0x1p-24;
}

}  // namespace

// Tolerance for 16-bit precisions, derived for SGD with momentum over n steps (u: the 16-bit
// format's unit roundoff, W: the world size, G: the largest gradient element, w: the largest
// weight):
// - each step's reduced gradient differs from the oracle's by at most (W + 1) u G: every rank
//   rounds its share to the reduce dtype and the sum is rounded again, where the oracle rounds
//   the exact sum once; and by 2 u G more where a compute-dtype weight rounded to the other
//   neighbour (the masters differ slightly), one ulp being 2u relative: (W + 3) u G in all;
// - momentum carries a gradient error into every later step: the weights move by
//   lr * sum_t sum_{k<=t} momentum^(t-k) g_k, at most lr * n (n + 1) / 2 times the error;
// - 16-bit masters (PureBf16) may each round to the other neighbour once per step: n * 2 u w.
// Plus 1e-6 for the fp32 arithmetic around it.
TEMPLATE_LIST_TEST_CASE("oracle: mixed and 16-bit precision strategies end on the emulated roundings of one process",
                        "[engine][oracle]", OracleMixed) {
  using P = typename TestType::precision;
  using CT = typename P::compute_type;
  const SgdConfig sgd = test::momentum_sgd();
  const Expected expected = train_reference<P>(sgd, sgd.lr, std::numeric_limits<double>::infinity());
  REQUIRE_FALSE(expected.overflowed);  // the engine would skip that step, the oracle does not
  double largest_weight = 0;
  for (const auto& [name, values] : expected.masters)
    for (double w : values) largest_weight = std::max(largest_weight, std::abs(w));
  const double u = unit_roundoff<CT>();
  const double n = kSteps;
  const bool master_16bit = !std::is_same_v<typename P::master_type, float>;
  for (const int world : {1, 3, 8}) {
    INFO("world size " << world);
    const double tolerance = sgd.lr * (world + 3) * u * expected.largest_grad * n * (n + 1) / 2 +
                             (master_16bit ? n * 2 * u * largest_weight : 0.0) + 1e-6;
    CAPTURE(tolerance);
    const Trained run = train_engine<TestType, Sgd<typename P::master_type>>(world, sgd, std::numeric_limits<double>::infinity());
    CHECK(max_master_difference(run, expected) < tolerance);
    // The first loss is computed from the same rounded weights: only float against double.
    CHECK(run.losses[0] == Approx(expected.losses[0]).epsilon(1e-6));
  }
}

TEST_CASE("oracle: AdamW and gradient clipping follow PyTorch's formulas under sharding", "[engine][oracle]") {
  const AdamWConfig adamw{.lr = 1e-2};
  const double clip = 0.05;  // below the gradient's norm at every step: clipping bites
  const Expected expected = train_reference<Fp32>(adamw, adamw.lr, clip);
  // Adam divides by the root of the second moment, so a gradient element near zero turns its
  // float rounding into a visible part of an update of size lr: the bound is 0.1% of lr per step
  // (2e-6 was the largest difference seen, against 3e-5: not float's roundoff, but far from a
  // wrong formula, which moves weights by a whole update).
  const double tolerance = 1e-3 * adamw.lr * kSteps;
  for (const int world : {1, 3, 8}) {
    INFO("world size " << world);
    CHECK(max_master_difference(train_engine<DDP, AdamW<float>>(world, adamw, clip), expected) < tolerance);
    CHECK(max_master_difference(train_engine<ZeRO<3>, AdamW<float>>(world, adamw, clip), expected) < tolerance);
    CHECK(max_master_difference(train_engine<ZeROOffload, AdamW<float>>(world, adamw, clip), expected) < tolerance);
  }
  // Without clipping the weights end elsewhere: the comparison above sees the clip.
  CHECK(max_master_difference(train_engine<DDP, AdamW<float>>(1, adamw, std::numeric_limits<double>::infinity()),
                              expected) > 10 * tolerance);
}
