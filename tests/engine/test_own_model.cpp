// A model of one's own, defined here and not in the library (the contract of docs/models.md):
// an embedding, residual feed-forward layers of the test's own type and an untied head. It
// trains under every sharding policy, its layers as units, with activation checkpointing, as
// one process does.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"

using namespace polyshard;

namespace {

/// x + down(gelu(up(norm(x)))): a layer of this test's own, a class template over the element
/// type and device as the library's modules are, so that WrapByType and ActivationCheckpointing
/// can name it.
template <FloatElement T, Device D = Cpu>
struct Residual {
  BOOST_HANA_DEFINE_STRUCT(Residual, (LayerNorm<T, D>, norm), (Linear<T, D>, up), (Gelu<T, D>, act), (Linear<T, D>, down));

  Residual() = default;
  explicit Residual(std::int64_t dim) : norm(dim), up(dim, 3 * dim), act{}, down(3 * dim, dim) {}

  /// x: (B, T, C) -> (B, T, C).
  Var<T, D> operator()(const Var<T, D>& x) const { return add(x, call(down, call(act, call(up, call(norm, x))))); }
};

/// The untied output head: a plain struct, which WrapByClass and ActivationCheckpointingByClass
/// name as it is. (B, T, C) -> (B, T, vocabulary).
struct Head {
  BOOST_HANA_DEFINE_STRUCT(Head, (LayerNorm<float>, norm), (Linear<float>, proj));

  Head(std::int64_t dim, std::int64_t vocabulary) : norm(dim), proj(dim, vocabulary) {}
  Var<float> operator()(const Var<float>& x) const { return call(proj, call(norm, x)); }
};

/// Token embedding, `layers` residual layers, an untied head: 13 tokens, 7 channels.
struct TinyLm {
  BOOST_HANA_DEFINE_STRUCT(TinyLm, (Embedding<float>, embed), (std::vector<Residual<float>>, layers), (Head, head));

  explicit TinyLm(int layers_count) : embed(13, 7), head(7, 13) {
    layers.reserve(static_cast<std::size_t>(layers_count));
    for (int i = 0; i < layers_count; ++i) layers.emplace_back(7);
  }
  // Parameters are bound by address: the model must not move once an engine holds it.
  TinyLm(const TinyLm&) = delete;
  TinyLm& operator=(const TinyLm&) = delete;

  /// Mean cross-entropy of predicting `targets` (B, T) from `ids` (B, T). The layers go through
  /// call(), so that an engine can gather, free and checkpoint them.
  Var<float> loss(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets) const {
    Var<float> x = embed(ids);  // (B, T, C)
    for (const auto& layer : layers) x = call(layer, x);
    return cross_entropy(call(head, x), targets);  // head: (B, T, 13)
  }
};

struct Trained {
  test::Parameters parameters;
  std::vector<double> losses;
  std::size_t units = 0;
  std::size_t checkpointed_units = 0;
};

template <class S>
Trained train_own(int world) {
  std::vector<Trained> runs(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Trained& run = runs[static_cast<std::size_t>(comm.rank())];
    TinyLm model(3);
    const SgdConfig sgd = test::momentum_sgd();
    Engine<S, TinyLm, ThreadCommunicator, Sgd<float>> engine(model, comm, sgd, {}, 42);
    run.units = engine.units().units.size();
    for (const auto& unit : engine.units().units) run.checkpointed_units += unit.checkpointed ? 1 : 0;
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    const RowRange rows = rank_rows(6, comm.rank(), world);
    const double weight = double(rows.end - rows.begin) / 6.0;
    for (int step = 0; step < 3; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      run.losses.push_back(loss.item() * weight);
      engine.backward(loss, weight);
      loss = Var<float>();
      engine.step(sgd.lr);
    }
    run.parameters = engine.full_parameters();
  });
  Trained out = std::move(runs[0]);
  for (std::size_t r = 1; r < runs.size(); ++r)
    for (std::size_t s = 0; s < out.losses.size(); ++s) out.losses[s] += runs[r].losses[s];
  return out;
}

using OwnStrategies =
    std::tuple<DDP, ZeRO<1>, ZeRO<2>, ZeRO<3>, Strategy<ShardParameters<true>, WrapRepeated<300>>,
               Strategy<ShardParameters<true>, WrapByType<Residual>>,
               Strategy<ShardParameters<true>, WrapByType<Residual>, ActivationCheckpointing<Residual>>,
               Strategy<ShardParameters<false>, WrapBySize<200>>, Strategy<ShardGradients, OffloadOptimizer<Cpu>>,
               Strategy<ShardParameters<true>, WrapByClass<Head, Residual<float>>,
                        ActivationCheckpointingByClass<Residual<float>>>>;

/// The units a wrap policy makes of TinyLm(3), the root included.
template <class Wrap>
constexpr std::size_t expected_units() {
  if constexpr (std::is_same_v<Wrap, WrapWhole>) return 1;
  // ZeRO<3>'s WrapRepeated<1e5>: layers of 336 parameters are under the threshold and stay in
  // the root (DeepSpeed keeps such small parameters whole); WrapRepeated<300> cuts each.
  else if constexpr (detail::repeated_min_num_params<Wrap>() > 336) return 1;
  else if constexpr (Wrap::template wraps_type<Head>) return 5;  // the head a unit too
  else return 4;  // one per layer: WrapBySize<200> cuts each (336 parameters), neither linear
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("a model defined outside the library trains under every sharding policy as one process does",
                        "[engine][own_model]", OwnStrategies) {
  const Trained one = train_own<DDP>(1);
  CHECK(one.losses.back() < one.losses.front());  // it learns
  for (const int world : {2, 3}) {
    INFO("world size " << world);
    const Trained run = train_own<TestType>(world);
    CHECK(run.units == expected_units<typename TestType::wrap>());
    const bool checkpoints = !std::is_same_v<typename TestType::checkpointing, NoActivationCheckpointing>;
    CHECK(run.checkpointed_units == (checkpoints ? 3u : 0u));
    CHECK(test::max_difference(run.parameters, one.parameters) < 1e-6);
    REQUIRE(run.losses.size() == one.losses.size());
    for (std::size_t s = 0; s < one.losses.size(); ++s) CHECK(run.losses[s] == Approx(one.losses[s]).epsilon(1e-6));
  }
}
