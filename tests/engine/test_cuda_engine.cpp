// The engine on one GPU against the engine on the host: the same strategy, model, data, seed and
// optimizer, the device run through Gpt<CT, Cuda>, NCCL (world size 1), the device's gradient
// arithmetic and the fused optimizers; the host run through the CPU path every engine test
// holds to its own oracles.
#include <catch2/catch.hpp>

#include <nccl.h>

#include <cmath>
#include <limits>
#include <string>

#include "polyshard/engine/cuda/engine.hpp"
#include "engine_fixture.hpp"
#include "io/temp_dir.hpp"
#include "polyshard/io/io.hpp"

using namespace polyshard;

namespace {

NcclCommunicator one_gpu() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  return NcclCommunicator(0, 1, id, 0);
}

/// One training step of tiny_gpt() (global batch 6, world size 1) on batch `step` of the tiny
/// data, on the host or the device the model is on; returns its loss.
template <class E, class T, class D>
double train_one_step(E& engine, Gpt<T, D>& model, int step, double lr = 1e-2,
                      double clip = std::numeric_limits<double>::infinity()) {
  const Batch b = BatchSampler(test::tiny_data(), 8, 6, 7).batch(step, 0, 1);
  auto loss = engine.forward([&] {
    if constexpr (std::same_as<D, Cuda>) return model.loss(to_device(b.inputs), to_device(b.targets));
    else return model.loss(b.inputs, b.targets);
  });
  const double value = double(float(loss.value().to_vector()[0]));
  engine.backward(loss, 1.0);
  loss = {};
  engine.step(lr, clip);
  return value;
}

/// test::train_rank on the GPU: tiny_gpt() computing in S's compute type, world size 1.
template <class S, class Opt = Sgd<float>>
test::RunResult train_on_gpu(int steps, typename Opt::config_type opt = test::momentum_sgd(),
                             double clip = std::numeric_limits<double>::infinity(), StrategyConfig config = {},
                             double* final_scale = nullptr) {
  using CT = typename S::compute_type;
  test::RunResult result;
  NcclCommunicator comm = one_gpu();
  Gpt<CT, Cuda> model(test::tiny_gpt());
  Engine<S, Gpt<CT, Cuda>, NcclCommunicator, Opt> engine(model, comm, opt, config, 42);
  for (int step = 0; step < steps; ++step) result.losses.push_back(train_one_step(engine, model, step, opt.lr, clip));
  if (final_scale) *final_scale = engine.loss_scaler().scale();
  result.parameters = engine.full_parameters();
  return result;
}

void check_losses(const std::vector<double>& got, const std::vector<double>& want, double tolerance) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": GPU " << got[i] << ", host " << want[i]);
    CHECK(std::isfinite(got[i]));
    CHECK(got[i] == Approx(want[i]).epsilon(tolerance));
  }
}

using DdpPerBlock = Strategy<NoShard, WrapByType<Block>>;
using ZeRO2PerBlock = Strategy<ShardGradients, WrapByType<Block>>;
using FsdpPerBlock = Strategy<ShardParameters<true>, WrapByType<Block>>;
using GradOpPerBlock = Strategy<ShardParameters<false>, WrapByType<Block>>;
using ZeRO3Checkpointed = Strategy<ShardParameters<true>, WrapByType<Block>, ActivationCheckpointing<Block>>;
// Offloaded from the GPU: master weights and optimizer state (and parameter shards) on the host.
using FsdpCpuOffload = Strategy<ShardParameters<true>, WrapByType<Block>, OffloadOptimizer<Cpu>>;
using ZeRO3ParamOffload = Strategy<ShardParameters<true>, WrapByType<Block>, OffloadParameters<Cpu>>;

}  // namespace

TEMPLATE_TEST_CASE("an fp32 GPT trains on one GPU as on the host, under every sharding policy", "[cuda][engine]",
                   DDP, ZeRO<1>, ZeRO2PerBlock, DdpPerBlock, FsdpPerBlock, GradOpPerBlock, ZeRO3Checkpointed,
                   ZeROOffload, FsdpCpuOffload, ZeRO3ParamOffload) {
  const double clip = GENERATE(std::numeric_limits<double>::infinity(), 0.5);
  const auto host = test::train<TestType>(1, 4, 6, test::momentum_sgd(), clip);
  const auto gpu = train_on_gpu<TestType>(4, test::momentum_sgd(), clip);
  check_losses(gpu.losses, host.losses, 1e-5);
  const double diff = test::max_difference(gpu.parameters, host.parameters);
  INFO("largest parameter difference " << diff << (std::isfinite(clip) ? " (clipped at 0.5)" : ""));
  CHECK(diff <= 2e-5);  // fp32 everywhere: sums in another order, nothing else
}

TEMPLATE_TEST_CASE("bf16 compute with fp32 masters on the GPU tracks the host's bf16 policy", "[cuda][engine]",
                   (Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>),
                   (Strategy<ShardGradients, OffloadOptimizer<Cpu>, Bf16Mixed>)) {
  using S = TestType;
  const auto host = test::train<S>(1, 4);
  const auto gpu = train_on_gpu<S>(4);
  // The host computes in float from bf16 parameters; the GPU keeps bf16 activations too.
  check_losses(gpu.losses, host.losses, 2e-2);
  CHECK(test::max_difference(gpu.parameters, host.parameters) <= 1.6e-2);  // about one bf16 ulp at 1.0
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
    for (int step = 0; step < 8; ++step) host.losses.push_back(train_one_step(engine, model, step, test::momentum_sgd().lr));
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

TEMPLATE_TEST_CASE("offloaded state of a device engine lives in pinned host memory, given back with the engine",
                   "[cuda][engine]", FsdpCpuOffload, ZeRO3ParamOffload) {
  auto& pinned = cuda::pinned_host_allocator();
  const std::size_t before = pinned.in_use_bytes();
  std::int64_t parameters = 0;
  {
    NcclCommunicator comm = one_gpu();
    Gpt<float, Cuda> model(test::tiny_gpt());
    Engine<TestType, Gpt<float, Cuda>, NcclCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    for (const auto& [name, values] : engine.full_parameters()) parameters += std::int64_t(values.size());
    // The master weights at least (world size 1: every shard is the whole unit), fp32.
    CHECK(pinned.in_use_bytes() - before >= std::size_t(parameters) * sizeof(float));
    train_one_step(engine, model, 0);  // gradients come down into pinned buffers too
    CHECK(pinned.in_use_bytes() - before >= 2 * std::size_t(parameters) * sizeof(float));
  }
  CHECK(pinned.in_use_bytes() == before);
}

TEMPLATE_TEST_CASE("a device engine's checkpoint resumes on the host, and the host's on the device, bit for bit",
                   "[cuda][engine][io]", ZeRO2PerBlock, FsdpPerBlock, FsdpCpuOffload) {
  using S = TestType;
  using Opt = AdamW<float>;
  const AdamWConfig adamw{.lr = 1e-2};
  TempDir dir;
  NcclCommunicator comm = one_gpu();
  Gpt<float, Cuda> gpu_model(test::tiny_gpt());
  Engine<S, Gpt<float, Cuda>, NcclCommunicator, Opt> gpu(gpu_model, comm, adamw, {}, 42);
  for (int step = 0; step < 2; ++step) train_one_step(gpu, gpu_model, step);
  save_checkpoint(gpu, dir / "from-gpu", {.step = 2});
  save_full_weights(gpu, dir / "gpu-weights.safetensors");
  const auto gpu_parameters = gpu.full_parameters();

  // The host resumes where the device stopped: the same masters, state and step count, so the
  // same next steps (within the products' rounding).
  test::Parameters host_parameters, host_from_weights;
  std::vector<double> host_losses;
  run_ranks(1, [&](ThreadCommunicator& host_comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Opt> host(model, host_comm, adamw, {}, 7);  // another seed
    const TrainingState state = load_checkpoint(host, dir / "from-gpu");
    POLYSHARD_CHECK(state.step == 2, "step ", state.step);
    host_parameters = host.full_parameters();
    for (int step = 2; step < 4; ++step) host_losses.push_back(train_one_step(host, model, step));
    save_checkpoint(host, dir / "from-host", {.step = 4});
    Engine<S, Gpt<float>, ThreadCommunicator, Opt> fresh(model, host_comm, adamw, {}, 9);
    load_full_weights(fresh, dir / "gpu-weights.safetensors");
    host_from_weights = fresh.full_parameters();
  });
  CHECK(test::max_difference(host_parameters, gpu_parameters) == 0.0);
  CHECK(test::max_difference(host_from_weights, gpu_parameters) == 0.0);

  std::vector<double> gpu_losses;
  for (int step = 2; step < 4; ++step) gpu_losses.push_back(train_one_step(gpu, gpu_model, step));
  check_losses(gpu_losses, host_losses, 1e-5);

  // And back: a fresh device engine loads the host's checkpoint and holds the host's parameters.
  Gpt<float, Cuda> resumed_model(test::tiny_gpt());
  Engine<S, Gpt<float, Cuda>, NcclCommunicator, Opt> resumed(resumed_model, comm, adamw, {}, 11);
  CHECK(load_checkpoint(resumed, dir / "from-host").step == 4);
  CHECK(test::max_difference(resumed.full_parameters(), gpu.full_parameters()) <= 2e-5);
}
