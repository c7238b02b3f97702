// The device engine on several GPUs, one thread per rank joined by NCCL, against the host engine
// on as many thread ranks: the same strategy, model, data, seed and optimizer. Sharding only
// shows at world sizes above one: shards of uneven size, reduce-scatters and all-gathers
// between ranks, a global gradient norm over shards. Runs wherever there are enough devices
// (the emulated device has four). Also the delayed parameter update's two-step run on one GPU
// and backward_and_step's on two, here so that the ThreadSanitizer runs ([tsan]) watch their
// host threads beside the device's work.
#include <optional>

#include "cuda_engine_fixture.hpp"
#include "polyshard/core/cuda/runtime.hpp"
#include "support/gpu_devices.hpp"

using namespace polyshard;
using namespace polyshard::test;

namespace {

/// test::train on `world` GPUs: rank r on device r, each step's loss summed over ranks; rank 0's
/// parameters. Empty when fewer than `world` devices are visible.
template <class S, class Opt = Sgd<float>>
std::optional<RunResult> train_on_gpus(int world, int steps, typename Opt::config_type opt = momentum_sgd(),
                                       double clip = std::numeric_limits<double>::infinity(), bool together = false,
                                       const StrategyConfig& config = {}) {
  using CT = typename S::compute_type;
  if (!test::have_devices(world)) return std::nullopt;
  std::vector<RunResult> results(static_cast<std::size_t>(world));
  const std::int64_t batch = 6;
  run_on_gpus(world, [&](int r, NcclCommunicator& comm) {
    RunResult& result = results[static_cast<std::size_t>(r)];
    Gpt<CT, Cuda> model(tiny_gpt());
    Engine<S, Gpt<CT, Cuda>, NcclCommunicator, Opt> engine(model, comm, opt, config, 42);
    BatchSampler sampler(tiny_data(), 8, batch, 7);
    const RowRange rows = rank_rows(batch, r, world);
    const double weight = double(rows.end - rows.begin) / double(batch);
    for (int step = 0; step < steps; ++step) {
      const Batch b = sampler.batch(step, r, world);
      auto loss = engine.forward([&] { return model.loss(to_device(b.inputs), to_device(b.targets)); });
      result.losses.push_back(double(float(loss.value().to_vector()[0])) * weight);
      if (together) {
        engine.backward_and_step(loss, weight, opt.lr, clip);
        continue;
      }
      engine.backward(loss, weight);
      loss = {};
      engine.step(opt.lr, clip);
    }
    result.parameters = engine.full_parameters();
  });
  RunResult result = std::move(results[0]);
  for (std::size_t r = 1; r < results.size(); ++r)
    for (std::size_t i = 0; i < result.losses.size(); ++i) result.losses[i] += results[r].losses[i];
  return result;
}

/// Trains S on `world` GPUs and on as many host ranks, from the same seed and data, and compares
/// the losses (relative `loss_tolerance`) and rank 0's parameters (`parameter_tolerance`). Not run
/// where fewer than `world` devices are visible (test::have_devices: the program then reports a
/// skip, or fails on the emulated device).
template <class S>
void check_gpus_match_host(int world, int steps, double loss_tolerance, double parameter_tolerance,
                           double clip = std::numeric_limits<double>::infinity()) {
  const auto gpu = train_on_gpus<S>(world, steps, momentum_sgd(), clip);
  if (!gpu) return;
  const auto host = test::train<S>(world, steps, 6, momentum_sgd(), clip);
  check_losses(gpu->losses, host.losses, loss_tolerance);
  CHECK(test::max_difference(gpu->parameters, host.parameters) <= parameter_tolerance);
}

using ZeRO1 = ZeRO<1>;

}  // namespace

TEMPLATE_TEST_CASE("an fp32 GPT trains on 2 and 3 GPUs as on as many host ranks, under every sharding policy",
                   "[cuda][engine][ranks]", DDP, ZeRO1, ZeRO2PerBlock, FsdpPerBlock, GradOpPerBlock, ZeRO3Checkpointed,
                   ZeROOffload, FsdpCpuOffload) {
  const int world = GENERATE(2, 3);
  const double clip = GENERATE(std::numeric_limits<double>::infinity(), 0.5);
  INFO("world size " << world << (std::isfinite(clip) ? ", clipped at 0.5" : ""));
  check_gpus_match_host<TestType>(world, 3, 1e-5, 2e-5, clip);
}

// The device side of tests/engine/test_allgather_pieces.cpp: each piece lands in a device buffer
// and is copied to its rank's place in the unit.
TEMPLATE_TEST_CASE("allgather_bucket_size on 2 and 3 GPUs: the updated shards all-gathered in pieces, bit for bit as "
                   "one all-gather a unit",
                   "[cuda][engine][ranks]", ZeRO1, ZeRO2PerBlock, (Strategy<ShardGradients, Bf16Mixed>), ZeROOffload) {
  const int world = GENERATE(2, 3);
  INFO("world size " << world);
  const auto whole = train_on_gpus<TestType>(world, 3);
  if (!whole) return;  // too few devices
  StrategyConfig pieces;
  pieces.allgather_bucket_size = 5 * world;  // 5 elements of each shard at a time
  const auto cut = train_on_gpus<TestType>(world, 3, momentum_sgd(), std::numeric_limits<double>::infinity(), false,
                                           pieces);
  REQUIRE(cut);
  CHECK(cut->losses == whole->losses);
  CHECK(cut->parameters == whole->parameters);
}

// FairScale's OSS partition on the device: each parameter whole in one rank's shard of its own
// size, reduced to its owner and broadcast from it; the updates are elementwise, so only the order
// of the reductions' sums can differ from the flat slices' (on the emulated device, not at all).
TEMPLATE_TEST_CASE("whole_parameters on 2 and 3 GPUs trains as the flat slices do", "[cuda][engine][ranks]", ZeRO1,
                   ZeRO2PerBlock, ZeROOffload) {
  const int world = GENERATE(2, 3);
  INFO("world size " << world);
  const auto flat = train_on_gpus<TestType>(world, 3);
  if (!flat) return;  // too few devices
  StrategyConfig whole;
  whole.partition = ShardPartition::whole_parameters;
  const auto owned = train_on_gpus<TestType>(world, 3, momentum_sgd(), std::numeric_limits<double>::infinity(), false,
                                             whole);
  REQUIRE(owned);
  check_losses(owned->losses, flat->losses, 1e-6);
  CHECK(test::max_difference(owned->parameters, flat->parameters) <= 1e-6);
}

// The oracle's checks of one GPU's 16-bit run (test_cuda_engine_precision.cpp) on 3: every
// master after every step, every rank's copy of a replicated unit, and the controls.
TEMPLATE_TEST_CASE("bf16 compute on 3 GPUs ends on the emulated roundings of one process", "[cuda][engine][ranks]",
                   (Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>),
                   (Strategy<ShardGradients, Bf16Mixed>), (Strategy<NoShard, Bf16Mixed>)) {
  using P = typename TestType::precision;
  const SgdConfig sgd = momentum_sgd();
  const auto run = train_padded_on_gpus<TestType>(3, sgd);
  if (!run) return;
  const oracle::Expected expected = oracle::train_reference<P>(sgd, sgd.lr, std::numeric_limits<double>::infinity());
  oracle::check_run<P>(*run, expected, sgd, 3, sgd.lr, /*activations_16bit=*/true);
  oracle::check_sharp<P>(*run, expected, sgd, 3, sgd.lr, /*activations_16bit=*/true);
}

TEST_CASE("FSDP on 2 GPUs for two steps: the run ThreadSanitizer watches", "[cuda][engine][ranks][tsan]") {
  // Small on purpose: ThreadSanitizer checks every access of every kernel. What it watches is
  // the concurrency: the gathers and reduce-scatters on the communication stream
  // beside the compute stream, the event waits between them and the host's reads.
  check_gpus_match_host<FsdpPerBlock>(2, 2, 1e-5, 2e-5);
}

TEST_CASE("sharded parameters on 2 GPUs: the host waits for no gather in forward, and once at backward's end",
          "[cuda][engine][ranks]") {
  // Each gathered unit is ordered on the compute stream by an event; the host waits for the
  // collectives only at the end of backward, where a failure or a timeout surfaces. Before,
  // forward waited for every unit's gather on the host (three a forward here), so that the host
  // could run no further ahead of the GPU than one unit.
  constexpr int world = 2;
  if (!test::have_devices(world)) return;
  std::vector<std::uint64_t> in_forward(world), in_backward(world), in_step(world);
  run_on_gpus(world, [&](int r, NcclCommunicator& comm) {
    Gpt<float, Cuda> model(tiny_gpt());
    Engine<FsdpPerBlock, Gpt<float, Cuda>, NcclCommunicator, Sgd<float>> engine(model, comm, momentum_sgd(), {}, 42);
    BatchSampler sampler(tiny_data(), 8, 6, 7);
    for (int step = 0; step < 2; ++step) {  // the second step prefetches: the order is known
      const Batch b = sampler.batch(step, r, world);
      const std::uint64_t start = comm.host_waits();
      auto loss = engine.forward([&] { return model.loss(to_device(b.inputs), to_device(b.targets)); });
      const std::uint64_t forwarded = comm.host_waits();
      engine.backward(loss, 0.5);
      const std::uint64_t backwarded = comm.host_waits();
      loss = {};
      engine.step(0.1);
      in_forward[r] = forwarded - start;
      in_backward[r] = backwarded - forwarded;
      in_step[r] = comm.host_waits() - backwarded;
    }
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(in_forward[r] == 0);
    // Backward's end: forward's gathers of the root and two blocks, backward's gathers of the
    // two blocks again (resharded after forward) and the three units' reductions, each once.
    CHECK(in_backward[r] == 8);
    CHECK(in_step[r] == 0);  // fp32, no clipping: the step needs no collective
  }
}

TEMPLATE_TEST_CASE("the device engine's traffic on 3 GPUs: what the emulated NCCL brought into each rank, none on a "
                   "real NCCL",
                   "[cuda][engine][ranks]", ZeRO2PerBlock, FsdpPerBlock) {
  // Engine::traffic() over NCCL, per rank, against the ring formula the engine recorded as each
  // collective was issued. The emulated NCCL computes each rank's result from every rank's
  // buffer, so a rank's measured bytes are the other ranks' parts of its result
  // (docs/communication.md): the ring's for a reduce-scatter and an all-gather, N / 2 times it
  // for an all-reduce; and the call check all-gathers 312 bytes from each other rank ahead of
  // each call. A real NCCL's transfers are invisible: nothing is measured there.
  constexpr int world = 3;
  if (!test::have_devices(world)) return;
  const bool emulated = &polyshard::emulation::take_nccl_traffic != nullptr;
  std::vector<CommStats> traffic(world);
  run_on_gpus(world, [&](int r, NcclCommunicator& comm) {
    Gpt<float, Cuda> model(tiny_gpt());
    Engine<TestType, Gpt<float, Cuda>, NcclCommunicator, Sgd<float>> engine(model, comm, momentum_sgd(), {}, 42);
    BatchSampler sampler(tiny_data(), 8, 6, 7);
    for (int step = 0; step < 2; ++step) {
      engine.reset_stats();
      const Batch b = sampler.batch(step, r, world);
      auto loss = engine.forward([&] { return model.loss(to_device(b.inputs), to_device(b.targets)); });
      engine.backward(loss, 0.5);
      loss = {};
      engine.step(0.1);
    }
    // Every collective of the step has been waited for: its traffic is counted.
    traffic[r] = engine.traffic();
  });
  const double check = default_check_calls() ? (world - 1) * 312.0 : 0.0;
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << (emulated ? ", emulated" : ", real") << " NCCL");
    const CommStats& t = traffic[r];
    const auto want = [&](CollectiveKind kind, double factor) {
      return emulated ? t.bytes_sent(kind) * factor + double(t.calls(kind)) * check : 0.0;
    };
    CHECK(t.bytes_moved(CollectiveKind::ReduceScatter) == Approx(want(CollectiveKind::ReduceScatter, 1)));
    CHECK(t.bytes_moved(CollectiveKind::AllGather) == Approx(want(CollectiveKind::AllGather, 1)));
    CHECK(t.bytes_moved(CollectiveKind::AllReduce) == Approx(want(CollectiveKind::AllReduce, world / 2.0)));
    CHECK(t.calls(CollectiveKind::ReduceScatter) > 0);  // the gradients were reduce-scattered
  }
}

TEST_CASE("ZeRO-Offload's delayed parameter update on one GPU for two steps: the run ThreadSanitizer watches",
          "[cuda][engine][offload][tsan]") {
  // The host thread updating the first step's masters while the second step's forward and
  // backward run on the device, and the second step joining it (test_cuda_engine.cpp holds
  // the longer runs to the oracle).
  StrategyConfig config;
  config.delayed_parameter_update = true;
  const auto gpu = train_on_gpu<ZeROOffload>(2, momentum_sgd(), std::numeric_limits<double>::infinity(), config);
  const ReferenceRun late = reference_run(2, /*delayed=*/true);
  check_losses(gpu.losses, late.losses, 1e-5);
  CHECK(max_named_difference(gpu.parameters, late.parameters) <= 2e-5);
}

namespace {
// ZeRO-2 by block with the optimizer on the host: the host thread copies each block's gradient
// shard down and steps it while the device runs the blocks before; the write-back all-gathers at
// the end.
using ZeRO2Offload = Strategy<ShardGradients, WrapByType<Block>, OffloadOptimizer<Cpu>>;
}  // namespace

TEST_CASE("backward_and_step on 2 and 3 GPUs: each rank's host steps beside its backward, bit for bit as "
          "backward then step",
          "[cuda][engine][offload]") {
  const int world = GENERATE(2, 3);
  INFO("world size " << world);
  const auto apart = train_on_gpus<ZeRO2Offload>(world, 2);
  if (!apart) return;  // too few devices
  const auto together =
      train_on_gpus<ZeRO2Offload>(world, 2, momentum_sgd(), std::numeric_limits<double>::infinity(), true);
  REQUIRE(together);
  CHECK(together->losses == apart->losses);
  CHECK(together->parameters == apart->parameters);
}

TEST_CASE("backward_and_step on two GPUs for two steps: the run ThreadSanitizer watches",
          "[cuda][engine][offload][tsan]") {
  // Held to the host engine (cheap under the sanitizer); the case above holds it bit for bit to
  // backward then step on the device.
  const auto gpu = train_on_gpus<ZeRO2Offload>(2, 2, momentum_sgd(), std::numeric_limits<double>::infinity(), true);
  if (!gpu) return;  // fewer than two devices
  const auto host = test::train<ZeRO2Offload>(2, 2, 6, momentum_sgd());
  check_losses(gpu->losses, host.losses, 1e-5);
  CHECK(test::max_difference(gpu->parameters, host.parameters) <= 2e-5);
}
