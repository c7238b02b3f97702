// Every byte a rank holds between steps belongs to a category the accounting predicts:
// resident_memory<S> per category (the host's float working copies of 16-bit parameters and
// gradients included, and NVMe offload's staging buffers), and the in-process backend's scratch
// by its documented rule; nothing left under activations. World sizes 1 to 8, on a model whose units pad at each.
#include <catch2/catch.hpp>

#include "io/temp_dir.hpp"
#include "oracle_fixture.hpp"

using namespace polyshard;

namespace {

/// What one rank holds after its last step, per category, and the unit sizes it was laid out with.
struct Held {
  std::array<std::int64_t, memory_category_count> bytes{};
  std::int64_t padded = 0, largest_unit = 0;
  std::int64_t at(MemoryCategory c) const { return bytes[static_cast<std::size_t>(c)]; }
};

template <class S>
std::vector<Held> hold(int world, const StrategyConfig& config) {
  using MT = typename S::master_type;
  std::vector<Held> held(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Held& h = held[static_cast<std::size_t>(comm.rank())];
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    comm.set_memory_tracker(tracker);
    {
      Gpt<float> model(test::oracle::padded_gpt());
      const SgdConfig sgd = test::momentum_sgd();
      Engine<S, Gpt<float>, ThreadCommunicator, Sgd<MT>> engine(model, comm, sgd, config, 42);
      for (const auto& u : engine.units().units) h.largest_unit = std::max(h.largest_unit, u.padded);
      h.padded = engine.units().padded_total();
      BatchSampler sampler(test::tiny_data(), 8, 8, 7);
      for (int step = 0; step < 2; ++step) {
        const Batch b = sampler.batch(step, comm.rank(), world);
        Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
        engine.backward(loss, double(b.inputs.size(0)) / 8.0);
        loss = Var<float>();
        engine.step(sgd.lr);
      }
      for (std::size_t c = 0; c < memory_category_count; ++c) h.bytes[c] = tracker.current(static_cast<MemoryCategory>(c));
    }
    comm.set_memory_tracker(detail::process_tracker());  // the communicator outlives this tracker
  });
  return held;
}

/// The in-process backend's scratch (docs/communication.md): one buffer of float partial sums,
/// kept, sized by the largest reduce-scatter input or 16-bit all-reduce it has run; none on one
/// rank. The sharded optimizers reduce-scatter each unit's gradients; DDP all-reduces them
/// in one bucket here (the model is far below bucket_cap_mb).
template <class S>
double thread_scratch_bytes(const Held& h, int world) {
  if (world == 1) return 0;
  if constexpr (S::sharding::shards_optimizer_state) return sizeof(float) * double(h.largest_unit);
  else return sizeof(typename S::reduce_type) == 2 ? sizeof(float) * double(h.padded) : 0.0;
}

template <class P>
using Presets = std::tuple<Strategy<NoShard, P>, Strategy<ShardOptimizerState, P>, Strategy<ShardGradients, P>,
                           Strategy<ShardParameters<true>, P>, Strategy<ShardParameters<true>, WrapByType<Block>, P>,
                           Strategy<ShardParameters<false>, WrapByType<Block>, P>,
                           Strategy<ShardGradients, OffloadOptimizer<Cpu>, P>,
                           Strategy<ShardParameters<true>, OffloadParameters<Cpu>, WrapByType<Block>, P>
#ifdef POLYSHARD_HAVE_LIBURING
                           ,
                           Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, WrapByType<Block>, P>
#endif
                           >;
using Measured = decltype(std::tuple_cat(Presets<Fp32>(), Presets<Bf16Mixed>(), Presets<PureBf16>(),
                                         std::tuple<Strategy<ShardParameters<true>, Fp16Mixed, WrapByType<Block>>>()));

}  // namespace

TEMPLATE_LIST_TEST_CASE("memory: what a rank holds between steps is the accounting's, category by category",
                        "[engine][memory]", Measured) {
  using S = TestType;
  test::TempDir nvme;
  StrategyConfig config;
  config.nvme_path = nvme.path().string();
  for (int world = 1; world <= 8; ++world) {
    const std::vector<Held> held = hold<S>(world, config);
    for (int rank = 0; rank < world; ++rank) {
      INFO("world size " << world << ", rank " << rank);
      const Held& h = held[static_cast<std::size_t>(rank)];
      if (world > 1) CHECK(h.largest_unit % world == 0);
      const ResidentMemory m = resident_memory<S>(h.padded, world, /*states_per_param=*/1, config);  // SGD, momentum
      CHECK(double(h.at(MemoryCategory::Parameters)) == m.parameters);
      CHECK(double(h.at(MemoryCategory::Gradients)) == m.gradients);
      CHECK(double(h.at(MemoryCategory::OptimizerState)) == m.optimizer_state);
      CHECK(double(h.at(MemoryCategory::WorkingCopies)) == m.working_copies);
      CHECK(double(h.at(MemoryCategory::Communication)) == thread_scratch_bytes<S>(h, world));
      CHECK(h.at(MemoryCategory::Activations) == 0);
      CHECK(double(h.at(MemoryCategory::Other)) == m.other);
    }
  }
}

TEST_CASE("memory: the per-category prediction adds up to ZeRO's model state where the engine keeps no extra copy",
          "[engine][memory]") {
  const std::int64_t p = 12'000'000;
  for (int n : {1, 2, 4, 8}) {
    // Device models (no working copies): ZeRO's 2 + 2 + 12 bytes per parameter for mixed Adam.
    CHECK(resident_memory<Strategy<NoShard, Bf16Mixed>, Cuda>(p, n).model_state() ==
          Approx(model_state_bytes<Strategy<NoShard, Bf16Mixed>>(p, n)));
    CHECK(resident_memory<Strategy<ShardParameters<>, Bf16Mixed>, Cuda>(p, n).model_state() == Approx(16.0 / n * p));
    CHECK(resident_memory<Strategy<ShardParameters<>, Bf16Mixed>, Cuda>(p, n).working_copies == 0);
    // On the host the same strategy keeps float copies to compute with: parameters and
    // gradients whole under DDP, none between steps under ZeRO-3.
    CHECK(resident_memory<Strategy<NoShard, Bf16Mixed>>(p, n).working_copies == Approx(8.0 * p));
    CHECK(resident_memory<Strategy<ShardParameters<>, Bf16Mixed>>(p, n).working_copies == 0);
    // A device's ZeRO-Offload keeps fp32 masters of its own on the host (the parameters stay on
    // the device) and a host copy of its gradient shard to step on.
    const auto offload = resident_memory<ZeROOffload, Cuda>(p, n);
    CHECK(offload.optimizer_state == Approx(4.0 * 3 * p / n));
    CHECK(offload.gradients == Approx(4.0 * p / n + 4.0 * p / n));
  }
}
