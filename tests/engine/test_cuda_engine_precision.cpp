// The engine on one GPU in 16-bit compute: bf16 and fp16 with fp32 masters against the oracle,
// fp16 with a dynamic loss scale against the host, frozen parameters, and the compute copy the
// fused step writes.
#include "cuda_engine_fixture.hpp"
#include "optimizer_list_oracle.hpp"

using namespace polyshard;
using namespace polyshard::test;

// The host's oracle checks (oracle_fixture.hpp), with the bound widened for activations kept in
// the compute type, which the host does not round: every master weight after every step within
// its tensor's bound, every loss, and the controls that must fail.
TEMPLATE_TEST_CASE("16-bit compute with fp32 masters on the GPU ends on the emulated roundings of one process",
                   "[cuda][engine]", (Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>),
                   (Strategy<ShardGradients, OffloadOptimizer<Cpu>, Bf16Mixed>),
                   (Strategy<ShardParameters<true>, WrapByType<Block>, OffloadParametersOnly<Cpu>, Bf16Mixed>),
                   (Strategy<ShardGradients, Fp16Mixed>)) {
  using P = typename TestType::precision;
  const SgdConfig sgd = test::momentum_sgd();
  const oracle::Expected expected = oracle::train_reference<P>(sgd, sgd.lr, std::numeric_limits<double>::infinity());
  REQUIRE_FALSE(expected.overflowed);
  const oracle::Trained run = *train_padded_on_gpus<TestType>(1, sgd);
  oracle::check_run<P>(run, expected, sgd, 1, sgd.lr, /*activations_16bit=*/true);
  oracle::check_sharp<P>(run, expected, sgd, 1, sgd.lr, /*activations_16bit=*/true);
  const oracle::Trained stalled = *train_padded_on_gpus<TestType>(1, sgd, {.zero_lr = 0});
  CHECK(oracle::excesses<P>(stalled.masters, expected, oracle::kSteps, 1, sgd.lr, true).size() > 0);
}

TEST_CASE("fp16 with dynamic loss scaling on the GPU skips and rescales as the host does", "[cuda][engine]") {
  // 2^22 overflows fp16 gradients at first: the first steps are skipped and the scale halves.
  using S = Strategy<ShardGradients, MixedPrecision<half, half, float, DynamicLossScale<22, 1000, 1>>>;
  double gpu_scale = 0;
  const auto gpu = train_on_gpu<S>(8, test::momentum_sgd(), std::numeric_limits<double>::infinity(), {}, &gpu_scale);
  double host_scale = 0;
  test::RunResult host;
  run_ranks(1, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    for (int step = 0; step < 8; ++step)
      host.losses.push_back(train_one_step(engine, model, step, test::momentum_sgd().lr));
    host_scale = engine.loss_scaler().scale();
    host.parameters = engine.full_parameters();
  });
  CHECK(gpu_scale == host_scale);
  CHECK(gpu_scale < std::ldexp(1.0, 22));  // some step overflowed and was skipped
  check_losses(gpu.losses, host.losses, 2e-2);
  CHECK(test::max_difference(gpu.parameters, host.parameters) <= 1e-2);
}

TEMPLATE_TEST_CASE("a frozen parameter keeps its bits on the GPU while the others train", "[cuda][engine]", ZeRO<1>,
                   (Strategy<ShardOptimizerState, Bf16Mixed>)) {
  using CT = typename TestType::compute_type;
  NcclCommunicator comm = one_gpu();
  Gpt<CT, Cuda> model(test::tiny_gpt());
  Engine<TestType, Gpt<CT, Cuda>, NcclCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{.lr = 1e-2}, {}, 42);
  const auto before = engine.full_parameters();
  model.transformer.wpe.weight.set_requires_grad(false);
  engine.refresh_trainable();
  for (int step = 0; step < 2; ++step) train_one_step(engine, model, step);
  const auto after = engine.full_parameters();
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    INFO(after[i].first);
    if (after[i].first == "transformer.wpe.weight") CHECK(after[i].second == before[i].second);
    else CHECK(after[i].second != before[i].second);
  }
}

TEMPLATE_TEST_CASE("the compute copy the fused step writes is the masters rounded to the compute type",
                   "[cuda][engine]", (Strategy<ShardGradients, WrapByType<Block>, Bf16Mixed>),
                   (Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>),
                   (Strategy<NoShard, Fp16Mixed>)) {
  using S = TestType;
  using CT = typename S::compute_type;
  NcclCommunicator comm = one_gpu();
  Gpt<CT, Cuda> model(test::tiny_gpt());
  Engine<S, Gpt<CT, Cuda>, NcclCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{.lr = 1e-2}, {}, 42);
  STATIC_REQUIRE(decltype(engine)::fuses_compute_copy);
  BatchSampler sampler(test::tiny_data(), 8, 6, 7);
  int applied = 0;
  for (int step = 0; step < 3; ++step) {
    const Batch b = sampler.batch(step, 0, 1);
    auto loss = engine.forward([&] { return model.loss(to_device(b.inputs), to_device(b.targets)); });
    engine.backward(loss, 1.0);
    loss = {};
    applied += engine.step(1e-2) ? 1 : 0;
  }
  CHECK(applied > 0);
  for (const auto& u : engine.unit_states()) {
    Tensor<CT, Cuda> copy;
    if constexpr (S::sharding::shards_parameters) copy = u.param_shard;
    else if constexpr (S::sharding::shards_optimizer_state) copy = u.full.flat_view(u.shard_begin(), u.shard);
    else copy = u.full;
    const auto want = cast<CT>(to_host(u.master)).to_vector();  // Eigen's round to nearest even
    const auto got = copy.to_vector();
    REQUIRE(got.size() == want.size());
    std::size_t differing = 0;
    for (std::size_t i = 0; i < got.size(); ++i) differing += got[i] == want[i] ? 0 : 1;
    CHECK(differing == 0);
  }
}

TEST_CASE("sub_group_size on the GPU: each sub-group stepped apart lands on the bits of one step a unit",
          "[cuda][engine]") {
  // The fused kernels writing each sub-group's slice of the bf16 copy on the device (a host step
  // in sub-groups: test_cuda_engine_io.cpp's ZeRO-Infinity case).
  using S = Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>;
  const AdamWConfig adamw{.lr = 1e-2};
  StrategyConfig pieces;
  pieces.sub_group_size = 37;
  const auto whole = train_on_gpu<S, AdamW<float>>(3, adamw);
  const auto cut = train_on_gpu<S, AdamW<float>>(3, adamw, std::numeric_limits<double>::infinity(), pieces);
  CHECK(test::max_difference(cut.parameters, whole.parameters) == 0.0);
  CHECK(cut.losses == whole.losses);
  CHECK(test::max_difference(whole.parameters, train_on_gpu<S, AdamW<float>>(0, adamw).parameters) > 1e-3);
}

TEMPLATE_TEST_CASE("parameters exempt from weight decay on the GPU: a zero gradient shrinks only the others, and "
                   "three steps end on the one-process oracle's weights",
                   "[cuda][engine]", FsdpPerBlock, FsdpCpuOffload, ZeRO3ParamOnlyOffload) {
  // The fused device AdamW (FsdpPerBlock, ZeRO3ParamOnlyOffload) and the host's for a device
  // model (FsdpCpuOffload), each in sub-groups of 37 elements cut anywhere by the exempt ranges.
  // An eps of 1e-3: with PyTorch's 1e-8, AdamW turns a near-zero gradient's last-bit difference
  // (the device sums in another order) into a step's difference of up to lr.
  const AdamWConfig adamw{.lr = 1e-2, .eps = 1e-3, .weight_decay = 0.1};
  StrategyConfig pieces;
  pieces.sub_group_size = 37;
  const auto run = [&](int steps, double loss_weight) {
    NcclCommunicator comm = one_gpu();
    Gpt<float, Cuda> model(test::tiny_gpt());
    decay_matrices_only(model);
    Engine<TestType, Gpt<float, Cuda>, NcclCommunicator, AdamW<float>> engine(model, comm, adamw, pieces, 42);
    std::pair<test::Parameters, test::Parameters> before_after{engine.full_parameters(), {}};
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    for (int step = 0; step < steps; ++step) {
      const Batch b = sampler.batch(step, 0, 1);
      auto loss = engine.forward([&] { return model.loss(to_device(b.inputs), to_device(b.targets)); });
      engine.backward(loss, loss_weight);
      loss = {};
      engine.step(adamw.lr);
    }
    before_after.second = engine.full_parameters();
    return before_after;
  };
  // A zero gradient: AdamW moves nothing but the decay, p (1 - lr wd), and an exempt parameter
  // (a vector: a bias or a norm, by its shape) not at all.
  const auto [before, after] = run(1, 0.0);
  const float shrink = static_cast<float>(1 - adamw.lr * adamw.weight_decay);
  Gpt<float> shapes(test::tiny_gpt());
  std::map<std::string, bool> is_vector;
  visit_parameters(shapes,
                   [&](const std::string& name, Parameter<float>& p) { is_vector[name] = p.shape().rank() < 2; });
  REQUIRE(after.size() == before.size());
  std::size_t differing = 0, exempt = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    REQUIRE(is_vector.count(after[i].first) == 1);
    const bool vector = is_vector[after[i].first];
    exempt += vector ? 1 : 0;
    for (std::size_t k = 0; k < after[i].second.size(); ++k)
      differing += after[i].second[k] == (vector ? before[i].second[k] : before[i].second[k] * shrink) ? 0 : 1;
  }
  CHECK(exempt == 18);
  CHECK(differing == 0);
  // Three steps against the oracle stepping each parameter with its own config: within the
  // order of the sums, far from the run that decays every parameter (a norm's weight of 1 loses
  // lr wd a step).
  const test::Parameters trained = run(3, 1.0).second;
  CHECK(test::max_difference(trained, test::adamw_matrices_only(3, adamw, true)) < 2e-5);
  CHECK(test::max_difference(trained, test::adamw_matrices_only(3, adamw, false)) > 1e-3);
}

TEMPLATE_TEST_CASE("an OptimizerList on the GPU: SGD with momentum beside Adam ends on the one-process oracle's "
                   "weights",
                   "[cuda][engine]", FsdpPerBlock, FsdpCpuOffload) {
  // The fused device kernels (FsdpPerBlock) and the host's for a device model (FsdpCpuOffload),
  // in sub-groups of 37 elements cut anywhere by where the optimizer changes.
  StrategyConfig pieces;
  pieces.sub_group_size = 37;
  NcclCommunicator comm = one_gpu();
  Gpt<float, Cuda> model(test::tiny_gpt());
  Engine<TestType, Gpt<float, Cuda>, NcclCommunicator, AnyOptimizer<float>> engine(model, comm, sgd_and_adam(),
                                                                                     pieces, 42);
  BatchSampler sampler(test::tiny_data(), 8, 6, 7);
  for (int step = 0; step < 3; ++step) {
    const Batch b = sampler.batch(step, 0, 1);
    auto loss = engine.forward([&] { return model.loss(to_device(b.inputs), to_device(b.targets)); });
    engine.backward(loss, 1.0);
    loss = {};
    engine.step(first_lr);
  }
  const test::Parameters trained = engine.full_parameters();
  CHECK(test::max_difference(trained, test::list_oracle(sgd_and_adam(), 3)) < 2e-5);
  CHECK(test::max_difference(trained, test::list_oracle({sgd_and_adam()[1]}, 3)) > 1e-4);  // Adam alone
}
