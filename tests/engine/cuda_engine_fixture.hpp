// Shared set-up of the device engine tests (test_cuda_engine*.cpp): one GPU over NCCL, one
// training step on either device, test::train_rank's twin on the GPU, and the strategies.
#pragma once

#include <catch2/catch.hpp>

#include <nccl.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "polyshard/engine/cuda/engine.hpp"
#include "engine_fixture.hpp"
#include "oracle_fixture.hpp"
#include "polyshard/core/cuda/runtime.hpp"
#include "support/gpu_devices.hpp"
#include "support/reference_trainer.hpp"

namespace polyshard::test {

inline NcclCommunicator one_gpu() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  return NcclCommunicator(0, 1, id, 0);
}

/// One training step of tiny_gpt() (global batch 6, world size 1) on batch `step` of the tiny
/// data, on the host or the device the model is on; returns its loss. `together`: through
/// backward_and_step rather than backward then step.
template <class E, class T, class D>
double train_one_step(E& engine, Gpt<T, D>& model, int step, double lr = 1e-2,
                      double clip = std::numeric_limits<double>::infinity(), bool together = false) {
  const Batch b = BatchSampler(test::tiny_data(), 8, 6, 7).batch(step, 0, 1);
  auto loss = engine.forward([&] {
    if constexpr (std::same_as<D, Cuda>) return model.loss(to_device(b.inputs), to_device(b.targets));
    else return model.loss(b.inputs, b.targets);
  });
  const double value = double(float(loss.value().to_vector()[0]));
  if (together) {
    engine.backward_and_step(loss, 1.0, lr, clip);
    return value;
  }
  engine.backward(loss, 1.0);
  loss = {};
  engine.step(lr, clip);
  return value;
}

/// test::train_rank on the GPU: tiny_gpt() computing in S's compute type, world size 1.
template <class S, class Opt = Sgd<float>>
test::RunResult train_on_gpu(int steps, typename Opt::config_type opt = test::momentum_sgd(),
                             double clip = std::numeric_limits<double>::infinity(), StrategyConfig config = {},
                             double* final_scale = nullptr, bool together = false) {
  using CT = typename S::compute_type;
  test::RunResult result;
  NcclCommunicator comm = one_gpu();
  Gpt<CT, Cuda> model(test::tiny_gpt());
  Engine<S, Gpt<CT, Cuda>, NcclCommunicator, Opt> engine(model, comm, opt, config, 42);
  for (int step = 0; step < steps; ++step)
    result.losses.push_back(train_one_step(engine, model, step, opt.lr, clip, together));
  if (final_scale) *final_scale = engine.loss_scaler().scale();
  result.parameters = engine.full_parameters();
  return result;
}

/// The double-precision oracle (tests/support/reference_trainer.hpp) on train_one_step's data
/// for `steps` steps of momentum SGD in fp32, applying each gradient one step late (`delayed`,
/// the last one after the run) or at once; its losses and final weights.
struct ReferenceRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<double>>> parameters;
};
inline ReferenceRun reference_run(int steps, bool delayed) {
  const SgdConfig sgd = test::momentum_sgd();
  ReferenceTrainer reference(test::tiny_gpt(), 42, sgd, ReferenceRounding::of<float, float, float>());
  if (delayed) reference.delay_updates();
  ReferenceRun out;
  for (int step = 0; step < steps; ++step)
    out.losses.push_back(reference.step(BatchSampler(test::tiny_data(), 8, 6, 7).batch(step, 0, 1), sgd.lr));
  reference.flush();
  out.parameters = reference.parameters();
  return out;
}

/// Runs body(rank, comm) on `world` threads, rank r on device r over an NCCL communicator of the
/// world, and requires (on the calling thread) that every rank returned without an exception.
/// Catch2's assertions are for the caller, after it returns: the bodies only compute.
template <class F>
void run_on_gpus(int world, F&& body) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        POLYSHARD_CUDA_CHECK(cudaSetDevice(r));
        NcclCommunicator comm(r, world, id, r);
        body(r, comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[static_cast<std::size_t>(r)].empty());
  }
}

/// oracle::train_engine's twin on `world` GPUs, rank r on device r: padded_gpt() computing in S's
/// compute type, its activations included, for oracle::kSteps steps of the oracle's batches,
/// `irregular` ones taken otherwise, as oracle::train_engine takes them.
/// Empty where fewer than `world` devices are visible (test::have_devices).
template <class S>
std::optional<oracle::Trained> train_padded_on_gpus(int world, const SgdConfig& sgd,
                                                    oracle::Irregular irregular = {}) {
  using CT = typename S::compute_type;
  if (!test::have_devices(world)) return std::nullopt;
  std::vector<oracle::RankMasters> ranks(static_cast<std::size_t>(world));
  run_on_gpus(world, [&](int r, NcclCommunicator& comm) {
    Gpt<CT, Cuda> model(oracle::padded_gpt());
    Engine<S, Gpt<CT, Cuda>, NcclCommunicator, Sgd<float>> engine(model, comm, sgd, {}, oracle::kSeed);
    oracle::take_oracle_steps(
        engine, [&](const Batch& b) { return model.loss(to_device(b.inputs), to_device(b.targets)); }, r, world,
        sgd.lr, std::numeric_limits<double>::infinity(), irregular, true, ranks[static_cast<std::size_t>(r)]);
  });
  return oracle::put_together(ranks);
}

inline void check_losses(const std::vector<double>& got, const std::vector<double>& want, double tolerance) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": GPU " << got[i] << ", host " << want[i]);
    CHECK(std::isfinite(got[i]));
    CHECK(got[i] == Approx(want[i]).epsilon(tolerance));
  }
}

// Offloaded from the GPU: master weights and optimizer state (and parameter shards) on the host.
using FsdpCpuOffload = Strategy<ShardParameters<true>, WrapByType<Block>, OffloadOptimizer<Cpu>>;
using ZeRO3ParamOffload = Strategy<ShardParameters<true>, WrapByType<Block>, OffloadParameters<Cpu>>;
// DeepSpeed's offload_param alone: the parameter shards on the host, the optimizer on the GPU.
using ZeRO3ParamOnlyOffload = Strategy<ShardParameters<true>, WrapByType<Block>, OffloadParametersOnly<Cpu>>;

}  // namespace polyshard::test
