// The engine on one GPU against the engine on the host: the same strategy, model, data, seed and
// optimizer, the device run through Gpt<CT, Cuda>, NCCL (world size 1), the device's gradient
// arithmetic and the fused optimizers; the host run through the CPU path every engine test
// holds to its own oracles. fp32 under every sharding policy here; the 16-bit policies in
// test_cuda_engine_precision.cpp, offload memory and checkpoints in test_cuda_engine_io.cpp.
#include "cuda_engine_fixture.hpp"

using namespace polyshard;
using namespace polyshard::test;

TEMPLATE_TEST_CASE("an fp32 GPT trains on one GPU as on the host, under every sharding policy", "[cuda][engine]",
                   DDP, ZeRO<1>, ZeRO2PerBlock, DdpPerBlock, FsdpPerBlock, GradOpPerBlock, ZeRO3Checkpointed,
                   ZeROOffload, FsdpCpuOffload, ZeRO3ParamOffload, ZeRO3ParamOnlyOffload) {
  const double clip = GENERATE(std::numeric_limits<double>::infinity(), 0.5);
  const auto host = test::train<TestType>(1, 4, 6, test::momentum_sgd(), clip);
  const auto gpu = train_on_gpu<TestType>(4, test::momentum_sgd(), clip);
  check_losses(gpu.losses, host.losses, 1e-5);
  const double diff = test::max_difference(gpu.parameters, host.parameters);
  INFO("largest parameter difference " << diff << (std::isfinite(clip) ? " (clipped at 0.5)" : ""));
  CHECK(diff <= 2e-5);  // fp32 everywhere: sums in another order, nothing else
}

TEMPLATE_TEST_CASE("a delayed parameter update on one GPU: the host steps beside the next forward and backward, "
                   "as the oracle that applies each gradient a step late",
                   "[cuda][engine][offload]", ZeROOffload, FsdpCpuOffload) {
  // The device engine with its fp32 masters and state on the host, updated on a host thread
  // while the GPU computes, against the double-precision oracle outside the engine.
  const ReferenceRun late = reference_run(4, /*delayed=*/true), prompt = reference_run(4, false);
  StrategyConfig config;
  config.delayed_parameter_update = true;
  const auto gpu = train_on_gpu<TestType>(4, test::momentum_sgd(), std::numeric_limits<double>::infinity(), config);
  check_losses(gpu.losses, late.losses, 1e-5);
  // The delay is real: ten times the tolerance away from the prompt update's loss.
  CHECK(std::abs(gpu.losses[1] - prompt.losses[1]) > 1e-4 * std::abs(prompt.losses[1]));
  // full_parameters() completes the update in flight: every gradient applied.
  CHECK(max_named_difference(gpu.parameters, late.parameters) <= 2e-5);
}

TEMPLATE_TEST_CASE("backward_and_step on one GPU: each unit's host step as its gradients land, bit for bit as "
                   "backward then step",
                   "[cuda][engine][offload]", ZeROOffload, FsdpCpuOffload, ZeRO3ParamOffload) {
  // The gradients copied down on the host thread's own stream after the compute stream's point,
  // checked and (without clipping) stepped there while the device runs backward for the units
  // before; with clipping, stepped after the global norm.
  const double clip = GENERATE(std::numeric_limits<double>::infinity(), 0.5);
  const auto apart = train_on_gpu<TestType>(4, test::momentum_sgd(), clip);
  const auto together = train_on_gpu<TestType>(4, test::momentum_sgd(), clip, {}, nullptr, /*together=*/true);
  CHECK(together.losses == apart.losses);
  CHECK(together.parameters == apart.parameters);
}
