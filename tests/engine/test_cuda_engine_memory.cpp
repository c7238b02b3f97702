// What a device engine holds between steps, measured where it is allocated: each rank's
// allocations (device buffers, and the host copies of offloaded strategies) counted by a tracker
// of its own, against resident_memory<S, Cuda>'s prediction per category (and nothing else but
// the model's cached positions), at world sizes 1 and 3, on a model whose units pad at 3.
#include <array>
#include <vector>

#include "cuda_engine_fixture.hpp"
#include "polyshard/policy/accounting.hpp"

using namespace polyshard;
using namespace polyshard::test;

namespace {

/// One rank's bytes per category after its last step, the padded parameters it laid out and the
/// rows of its batches.
struct Held {
  std::array<std::int64_t, memory_category_count> bytes{};
  std::int64_t padded = 0, rows = 0;
  double at(MemoryCategory c) const { return static_cast<double>(bytes[static_cast<std::size_t>(c)]); }
};

/// Two steps of padded_gpt() under S on `world` GPUs (momentum SGD: one state value a
/// parameter); each rank's tracker read after the device has finished the last step.
template <class S>
std::optional<std::vector<Held>> hold_on_gpus(int world) {
  using CT = typename S::compute_type;
  if (!test::have_devices(world)) return std::nullopt;
  std::vector<Held> held(static_cast<std::size_t>(world));
  run_on_gpus(world, [&](int r, NcclCommunicator& comm) {
    Held& h = held[static_cast<std::size_t>(r)];
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    {
      Gpt<CT, Cuda> model(oracle::padded_gpt());
      const SgdConfig sgd = momentum_sgd();
      Engine<S, Gpt<CT, Cuda>, NcclCommunicator, Sgd<float>> engine(model, comm, sgd, {}, oracle::kSeed);
      BatchSampler sampler(tiny_data(), 8, 6, 7);
      const RowRange rows = rank_rows(6, r, world);
      for (int step = 0; step < 2; ++step) {
        const Batch b = sampler.batch(step, r, world);
        auto loss = engine.forward([&] { return model.loss(to_device(b.inputs), to_device(b.targets)); });
        engine.backward(loss, double(rows.end - rows.begin) / 6.0);
        loss = {};
        engine.step(sgd.lr);
      }
      POLYSHARD_CUDA_CHECK(cudaDeviceSynchronize());
      for (std::size_t c = 0; c < memory_category_count; ++c)
        h.bytes[c] = tracker.current(static_cast<MemoryCategory>(c));
      h.padded = engine.units().padded_total();
      h.rows = rows.end - rows.begin;
    }
  });
  return held;
}

using Measured =
    std::tuple<Strategy<NoShard, Fp32>, Strategy<NoShard, Bf16Mixed>, Strategy<ShardOptimizerState, Bf16Mixed>,
               Strategy<ShardGradients, Bf16Mixed>, Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>,
               Strategy<ShardParameters<true>, WrapByType<Block>, Fp32>,
               Strategy<ShardGradients, OffloadOptimizer<Cpu>, Bf16Mixed>,
               Strategy<ShardParameters<true>, WrapByType<Block>, OffloadParametersOnly<Cpu>, Bf16Mixed>,
               Strategy<ShardParameters<true>, WrapByType<Block>, OffloadParametersOnly<Cpu>, Fp32>>;

// Where OffloadParametersOnly keeps what (the tracker counts categories, not devices): the
// parameter shards in host memory, the masters and optimizer state on the device that steps them,
// in fp32 too, where the masters are then a copy of their own.
using ParametersAlone = UnitState<bfloat16, float, float, Cuda, OffloadParametersOnly<Cpu>>;
static_assert(std::same_as<ParametersAlone::shard_device, Cpu> && std::same_as<ParametersAlone::step_device, Cuda>);
static_assert(!UnitState<float, float, float, Cuda, OffloadParametersOnly<Cpu>>::master_is_shard);
using ParametersAndOptimizer = UnitState<bfloat16, float, float, Cuda, OffloadParameters<Cpu>>;
static_assert(std::same_as<ParametersAndOptimizer::step_device, Cpu>);

}  // namespace

TEMPLATE_LIST_TEST_CASE("memory: a device engine holds between steps what resident_memory<S, Cuda> predicts, "
                        "category by category",
                        "[cuda][engine][memory]", Measured) {
  using S = TestType;
  for (const int world : {1, 3}) {
    const auto held = hold_on_gpus<S>(world);
    if (!held) {
      WARN("fewer than " << world << " devices: world size " << world << " not run");
      continue;
    }
    for (int r = 0; r < world; ++r) {
      const Held& h = (*held)[static_cast<std::size_t>(r)];
      INFO("world size " << world << ", rank " << r << ", " << h.padded << " padded parameters");
      if (world > 1) CHECK(h.padded % world == 0);
      const ResidentMemory m = resident_memory<S, Cuda>(h.padded, world, /*states_per_param=*/1);
      CHECK(h.at(MemoryCategory::Parameters) == m.parameters);
      CHECK(h.at(MemoryCategory::Gradients) == m.gradients);
      CHECK(h.at(MemoryCategory::OptimizerState) == m.optimizer_state);
      CHECK(h.at(MemoryCategory::WorkingCopies) == m.working_copies);
      CHECK(h.at(MemoryCategory::Activations) == 0);
      CHECK(h.at(MemoryCategory::Communication) == 0);  // NCCL's buffers are its own, not the tracker's
      // Beside the model state, the GPT keeps its last batch's positions on the device, (rows, T)
      // int32, so that the next step of that shape copies nothing (nn/gpt.hpp).
      const double positions = double(h.rows * oracle::padded_gpt().block_size) * sizeof(std::int32_t);
      CHECK(h.at(MemoryCategory::Other) == m.other + positions);
    }
  }
}
