// Every byte a rank holds belongs to a category the accounting predicts. Between steps:
// resident_memory<S> per category (the host's float working copies of 16-bit parameters and
// gradients included, and NVMe offload's staging buffers); nothing under communication (the
// in-process backend keeps no scratch) nor activations. Within a step: host_step_peak_memory<S>'s
// peak per category (gathered and prefetched units, whole gradients awaiting their reduction, the
// copies collectives read). Activations are measured and reported per unit. World sizes 1 to 8,
// on a model whose units pad at each.
#include <catch2/catch.hpp>

#include "expected_layout.hpp"
#include "io/temp_dir.hpp"
#include "oracle_fixture.hpp"
#include "polyshard/policy/step_memory.hpp"

using namespace polyshard;

namespace {

/// What one rank holds after its last step and at most during it, per category, and the unit
/// sizes it was laid out with.
struct Held {
  std::array<std::int64_t, memory_category_count> bytes{}, peak{};
  std::array<std::int64_t, memory_category_count> built_peak{};  // the most held while the engine was built
  std::int64_t padded = 0, largest_unit = 0;
  std::vector<std::int64_t> units;  // padded sizes, root first, in the order forward runs them
  std::vector<std::size_t> buckets;  // gradient buckets per unit
  std::vector<std::int64_t> sub_groups;  // the optimizer's sub-groups, unit after unit
  std::int64_t at(MemoryCategory c) const { return bytes[static_cast<std::size_t>(c)]; }
  std::int64_t peak_at(MemoryCategory c) const { return peak[static_cast<std::size_t>(c)]; }
  std::int64_t built_peak_at(MemoryCategory c) const { return built_peak[static_cast<std::size_t>(c)]; }
};

/// The test model: padded_gpt() with four blocks, so that "two consecutive units" differs from
/// "every unit" (units of 299 and 4 x 2,197 parameters).
GptConfig four_blocks() {
  GptConfig c = test::oracle::padded_gpt();
  c.n_layer = 4;
  return c;
}

/// The engine's units of four_blocks() and their gradient buckets against expected_layout.hpp's,
/// worked out from the shapes: a bucket holds whole parameters and bucket_cap_mb MiB of the
/// reduce type, so a unit's gradients are one bucket under a cap above the unit's size and one
/// bucket per parameter under one below every parameter's (the two caps these tests use).
template <class S>
void check_layout(const Held& h, int world, const StrategyConfig& config) {
  const test::GptShapes shapes = test::gpt_shapes(four_blocks());
  const std::vector<std::int64_t> padded = test::padded_units<S>(shapes, world);
  // The cap is bucket_cap_mb's, or with none set the reference's (25 MiB, 2^23 or 2e8 elements),
  // above any unit of this model.
  REQUIRE(!config.reduce_bucket_size);
  REQUIRE(!config.reduce_buffer_size);
  const double cap = config.bucket_cap_mb ? *config.bucket_cap_mb * 1024 * 1024 / sizeof(typename S::reduce_type)
                                          : 25.0 * 1024 * 1024 / 4;
  std::vector<std::size_t> buckets;
  for (const auto& params : test::unit_parameters<S>(shapes)) {
    const std::int64_t n = test::sum(params);
    const auto smallest = *std::min_element(params.begin(), params.end());
    REQUIRE((cap >= double(n) || cap < double(smallest)));
    buckets.push_back(cap >= double(n) ? 1 : params.size());
  }
  CHECK(h.units == padded);
  CHECK(h.padded == test::sum(padded));
  CHECK(h.buckets == buckets);
}

/// What each of `world` ranks holds after three steps of four_blocks() under S, and the most it
/// held within the last; `matrices_only`: its biases and norms exempt from weight decay
/// (decay_matrices_only), which cuts the optimizer's sub-groups.
template <class S>
std::vector<Held> hold(int world, const StrategyConfig& config, bool matrices_only = false) {
  using MT = typename S::master_type;
  std::vector<Held> held(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Held& h = held[static_cast<std::size_t>(comm.rank())];
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    comm.set_memory_tracker(tracker);
    {
      Gpt<float> model(four_blocks());
      if (matrices_only) decay_matrices_only(model);
      const SgdConfig sgd = test::momentum_sgd();
      Engine<S, Gpt<float>, ThreadCommunicator, Sgd<MT>> engine(model, comm, sgd, config, 42);
      for (std::size_t c = 0; c < memory_category_count; ++c)
        h.built_peak[c] = tracker.peak(static_cast<MemoryCategory>(c));
      for (std::size_t i = 0; i < engine.units().units.size(); ++i) {
        h.largest_unit = std::max(h.largest_unit, engine.units().units[i].padded);
        h.units.push_back(engine.units().units[i].padded);
        h.buckets.push_back(engine.gradient_buckets(i).size());
      }
      h.padded = engine.units().padded_total();
      h.sub_groups = optimizer_sub_group_sizes(engine.optimizers());
      BatchSampler sampler(test::tiny_data(), 8, 8, 7);
      for (int step = 0; step < 3; ++step) {
        if (step == 2) tracker.reset_peaks();  // a steady-state step: prefetch knows the order
        const Batch b = sampler.batch(step, comm.rank(), world);
        Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
        engine.backward(loss, double(b.inputs.size(0)) / 8.0);
        loss = Var<float>();
        engine.step(sgd.lr);
      }
      for (std::size_t c = 0; c < memory_category_count; ++c) {
        h.bytes[c] = tracker.current(static_cast<MemoryCategory>(c));
        h.peak[c] = tracker.peak(static_cast<MemoryCategory>(c));
      }
    }
    comm.set_memory_tracker(detail::process_tracker());  // the communicator outlives this tracker
  });
  for (int rank = 0; rank < world; ++rank) {
    INFO("world size " << world << ", rank " << rank << ": the units laid out");
    check_layout<S>(held[static_cast<std::size_t>(rank)], world, config);
  }
  return held;
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
// The parameter shards on NVMe, where the masters are the shards (fp32) and where they are not.
#ifdef POLYSHARD_HAVE_LIBURING
using OnNvme = Strategy<ShardParameters<true>, OffloadParameters<Nvme>, WrapByType<Block>>;
using ParametersOnNvme = std::tuple<OnNvme, with_t<OnNvme, Bf16Mixed>>;
#else
using ParametersOnNvme = std::tuple<>;
#endif
using Measured = decltype(std::tuple_cat(Presets<Fp32>(), Presets<Bf16Mixed>(), Presets<PureBf16>(),
                                         std::tuple<Strategy<ShardParameters<true>, Fp16Mixed, WrapByType<Block>>>(),
                                         ParametersOnNvme()));

}  // namespace

TEMPLATE_LIST_TEST_CASE("memory: what a rank holds between steps and at most within one is the accounting's, "
                        "category by category",
                        "[engine][memory]", Measured) {
  using S = TestType;
  test::TempDir nvme;
  StrategyConfig config;
  if constexpr (S::offload::to_nvme) {
    config.nvme_path = nvme.path().string();
    config.optimizer_buffer_count = nvme_buffers_per_sub_group(1);  // one unit's momentum at a time: exact peaks
  }
  if constexpr (S::offload::to_nvme && S::offload::offloads_parameters) {
    config.params_buffer_count = 1;  // one unit's shard read in at a time, an exact peak
    config.max_in_cpu = 0;           // every shard in the file
  }
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
      CHECK(h.at(MemoryCategory::Communication) == 0);  // the in-process backend keeps no scratch
      CHECK(h.at(MemoryCategory::Activations) == 0);
      CHECK(double(h.at(MemoryCategory::Other)) == m.other);

      const StepPeakMemory peak = host_step_peak_memory<S>(h.units, world, /*states_per_param=*/1, config, h.buckets);
      CHECK(double(h.peak_at(MemoryCategory::Parameters)) == peak.parameters);
      CHECK(double(h.peak_at(MemoryCategory::Gradients)) == peak.gradients);
      CHECK(double(h.peak_at(MemoryCategory::OptimizerState)) == peak.optimizer_state);
      CHECK(double(h.peak_at(MemoryCategory::WorkingCopies)) == peak.working_copies);
      CHECK(double(h.peak_at(MemoryCategory::Communication)) == peak.communication);
      CHECK(double(h.peak_at(MemoryCategory::Other)) == peak.other);

      // While the engine was built: what it then holds, and under NVMe offload one unit more.
      const StepPeakMemory built = host_construction_peak_memory<S>(h.units, world, 1, config);
      CHECK(double(h.built_peak_at(MemoryCategory::Parameters)) == built.parameters);
      CHECK(double(h.built_peak_at(MemoryCategory::Gradients)) == built.gradients);
      CHECK(double(h.built_peak_at(MemoryCategory::OptimizerState)) == built.optimizer_state);
      CHECK(double(h.built_peak_at(MemoryCategory::WorkingCopies)) == built.working_copies);
      CHECK(h.built_peak_at(MemoryCategory::Communication) == 0);
      CHECK(double(h.built_peak_at(MemoryCategory::Other)) == built.other);
    }
  }
}

namespace {
/// The engine's peaks against host_step_peak_memory's, world sizes 1 to 8, under `config`.
template <class S>
void check_step_peaks(const StrategyConfig& config) {
  for (int world = 1; world <= 8; ++world) {
    const std::vector<Held> held = hold<S>(world, config);
    for (int rank = 0; rank < world; ++rank) {
      INFO("world size " << world << ", rank " << rank);
      const Held& h = held[static_cast<std::size_t>(rank)];
      const StepPeakMemory peak = host_step_peak_memory<S>(h.units, world, 1, config, h.buckets);
      CHECK(double(h.peak_at(MemoryCategory::Parameters)) == peak.parameters);
      CHECK(double(h.peak_at(MemoryCategory::Gradients)) == peak.gradients);
      CHECK(double(h.peak_at(MemoryCategory::WorkingCopies)) == peak.working_copies);
      CHECK(double(h.peak_at(MemoryCategory::Communication)) == peak.communication);
    }
  }
}
}  // namespace

TEST_CASE("memory: the step's peaks follow the schedule: prefetch, overlapped reductions, resharding",
          "[engine][memory]") {
  using Zero3 = Strategy<ShardParameters<true>, WrapByType<Block>>;
  const std::vector<std::int64_t> units = {299, 2197, 2197, 2197, 2197};  // world size 1: no padding
  const double r = 299 * 4, b = 2197 * 4;
  const ResidentMemory resident = resident_memory<Zero3>(299 + 4 * 2197, 1, 1);
  // ZeRO-3 by block: the root stays gathered through forward and backward, and beside it a block
  // and the next one, prefetched; whole gradients of the root and of two blocks (one reducing
  // while the next one's backward runs).
  StepPeakMemory p = host_step_peak_memory<Zero3>(units, 1, 1);
  CHECK(p.parameters == resident.parameters + r + 2 * b);
  CHECK(p.gradients == resident.gradients + r + 2 * b);
  StrategyConfig no_prefetch;
  no_prefetch.prefetch = false;
  CHECK(host_step_peak_memory<Zero3>(units, 1, 1, no_prefetch).parameters == resident.parameters + r + b);
  StrategyConfig no_overlap;
  no_overlap.overlap_comm = false;
  CHECK(host_step_peak_memory<Zero3>(units, 1, 1, no_overlap).gradients == resident.gradients + r + b);
  // Without resharding after forward, every unit stays gathered until its backward.
  using Grad_op = Strategy<ShardParameters<false>, WrapByType<Block>>;
  CHECK(host_step_peak_memory<Grad_op>(units, 1, 1).parameters == resident.parameters + r + 4 * b);
  // In bf16 on the host, the gathered bf16 buffer lives only until its float copy is made.
  using Zero3Bf16 = Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>;
  const ResidentMemory resident16 = resident_memory<Zero3Bf16>(299 + 4 * 2197, 1, 1);
  CHECK(host_step_peak_memory<Zero3Bf16>(units, 1, 1).parameters == resident16.parameters + 2197 * 2);

  // A prefetch budget of two blocks (stage3_prefetch_bucket_size; padded blocks hold at most 2,204
  // elements up to world size 8): two blocks ahead of the one running.
  StrategyConfig two_ahead;
  two_ahead.stage3_prefetch_bucket_size = 4600;
  CHECK(host_step_peak_memory<Zero3>(units, 1, 1, two_ahead).parameters == resident.parameters + r + 3 * b);

  // The engine against them, at every world size, with each schedule switched off.
  check_step_peaks<Zero3>(no_prefetch);
  check_step_peaks<Zero3>(two_ahead);
  check_step_peaks<Zero3Bf16>(two_ahead);
  check_step_peaks<Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed, OffloadParameters<Cpu>>>(two_ahead);
  check_step_peaks<Zero3>(no_overlap);
  check_step_peaks<Zero3Bf16>(no_overlap);
  check_step_peaks<Strategy<ShardOptimizerState, WrapByType<Block>>>(no_overlap);
  // Buckets of one parameter, reduced while backward runs: ZeRO-1 reduces them in place.
  StrategyConfig small_buckets;
  small_buckets.bucket_cap_mb = 1e-9;
  check_step_peaks<Strategy<ShardOptimizerState, WrapByType<Block>>>(small_buckets);
  check_step_peaks<Strategy<ShardOptimizerState, WrapByType<Block>, Bf16Mixed>>(small_buckets);
  check_step_peaks<Strategy<ShardGradients, WrapByType<Block>, Bf16Mixed>>(small_buckets);
  check_step_peaks<Zero3Bf16>(small_buckets);
  check_step_peaks<Zero3>(small_buckets);
  check_step_peaks<DDP>(small_buckets);
  const std::vector<std::size_t> split(units.size(), 7);
  using Zero1 = Strategy<ShardOptimizerState, WrapByType<Block>>;
  // Split into buckets, ZeRO-1's reductions read no copy: what is left is the write-back
  // all-gather's copy of a block's shard, c p / N.
  const double split_peak = host_step_peak_memory<Zero1>(units, 4, 1, {}, split).communication;
  CHECK(split_peak == 4.0 * 2197 / 4);
  // One bucket a unit: two blocks' copies in flight (one reducing while the next one's backward
  // runs), each the gradients 4 p and the output shard 4 p / N.
  CHECK(host_step_peak_memory<Zero1>(units, 4, 1).communication == 2 * (4.0 * 2197 + 4.0 * 2197 / 4));
}

TEST_CASE("memory: allgather_bucket_size's pieces hold one piece of every rank's shard after the step, not a copy of "
          "the shard",
          "[engine][memory]") {
  // ZeRO-2 at world size 4 on one unit of 8,800 elements, 2,200 a shard: the all-gather copies
  // the shard out (4 x 2,200 bytes), or, 16 elements of each shard at a time (a bucket of 64),
  // a piece's copy and the buffer the four pieces land in (4 x (16 + 4 x 16)).
  StrategyConfig pieces;
  pieces.allgather_bucket_size = 64;
  const std::vector<std::int64_t> unit = {8800};
  CHECK(host_step_peak_memory<Strategy<ShardGradients>>(unit, 4, 1).communication == 4.0 * 2200);
  CHECK(host_step_peak_memory<Strategy<ShardGradients>>(unit, 4, 1, pieces).communication == 4.0 * (16 + 4 * 16));
  // The engine's peaks, world sizes 1 to 8, against the prediction.
  check_step_peaks<Strategy<ShardGradients>>(pieces);
  check_step_peaks<Strategy<ShardGradients, WrapByType<Block>, Bf16Mixed>>(pieces);
  check_step_peaks<Strategy<ShardOptimizerState>>(pieces);
  check_step_peaks<Strategy<ShardOptimizerState, Bf16Mixed>>(pieces);
}

TEST_CASE("memory: ZeRO-3 by repeated layer (the preset's WrapRepeated) holds the root and two blocks whole",
          "[engine][memory]") {
  // The preset's rule with a threshold the test model's blocks (2,197 parameters) pass; its own
  // 1e5 leaves a model this small whole, as DeepSpeed leaves parameters under
  // stage3_param_persistence_threshold unpartitioned.
  using Zero3Layers = Strategy<ShardParameters<true>, WrapRepeated<2000>>;
  STATIC_REQUIRE(std::is_same_v<ZeRO<3>, Strategy<ShardParameters<true>, WrapRepeated<100'000>, DeepSpeedDefaults>>);
  for (int world : {1, 4}) {
    INFO("world size " << world);
    const std::vector<Held> held = hold<Zero3Layers>(world, {});
    for (const Held& h : held) {
      REQUIRE(h.units.size() == 5);  // the root, then the four blocks
      const std::int64_t root = h.units[0], block = h.units[1];
      // Sizes from the model itself: the root's 299 parameters and each block's 2,197, padded to
      // a multiple of the world size.
      CHECK(root == (299 + world - 1) / world * world);
      CHECK(block == (2197 + world - 1) / world * world);
      const StepPeakMemory peak = host_step_peak_memory<Zero3Layers>(h.units, world, 1, {});
      CHECK(double(h.peak_at(MemoryCategory::Parameters)) == peak.parameters);
      // Every rank's shards, plus the root and two blocks gathered whole (one running, one
      // prefetched): never the whole model.
      const double bound = 4.0 * double(h.padded / world + root + 2 * block);
      CHECK(double(h.peak_at(MemoryCategory::Parameters)) <= bound);
      if (world == 4) CHECK(double(h.peak_at(MemoryCategory::Parameters)) < 4.0 * double(h.padded));
    }
  }
  // The preset itself: a model whose layers pass 1e5 parameters is cut into them (GPT L2 C128:
  // 198,272 parameters a block), a smaller one stays whole.
  Gpt<float> big(GptConfig{.vocab_size = 64, .block_size = 16, .n_layer = 2, .n_head = 4, .n_embd = 128});
  CHECK(plan_units<ZeRO<3>::wrap, NoActivationCheckpointing, float>(big, 1).units.size() == 3);
  Gpt<float> small(four_blocks());
  CHECK(plan_units<ZeRO<3>::wrap, NoActivationCheckpointing, float>(small, 1).units.size() == 1);
}

#ifdef POLYSHARD_HAVE_LIBURING
TEST_CASE("memory: NVMe offload brings back at most the consecutive units' state optimizer_buffer_count holds",
          "[engine][memory]") {
  using Infinity = Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, WrapByType<Block>>;
  test::TempDir nvme;
  StrategyConfig config;
  config.nvme_path = nvme.path().string();
  config.optimizer_buffer_count = 4 * nvme_buffers_per_sub_group(1);  // four units' momentum
  StrategyConfig one = config;
  one.optimizer_buffer_count = nvme_buffers_per_sub_group(1);
  for (int world : {1, 3}) {
    const std::vector<Held> held = hold<Infinity>(world, config);
    for (const Held& h : held) {
      const double measured = double(h.peak_at(MemoryCategory::OptimizerState));
      // Between the one unit's state that a step needs at least and the bound, depending on
      // how far the writes lag behind the reads.
      CHECK(measured >= host_step_peak_memory<Infinity>(h.units, world, 1, one).optimizer_state);
      CHECK(measured <= host_step_peak_memory<Infinity>(h.units, world, 1, config).optimizer_state);
    }
  }
}
#endif

#ifdef POLYSHARD_HAVE_LIBURING
namespace {
using InfinityPerBlock = Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, WrapByType<Block>>;

/// NVMe offload under `nvme` with buffers for one sub-group's momentum (and masters) at a time,
/// so that the optimizer state a step brings back peaks exactly at the largest sub-group.
StrategyConfig one_sub_group_in_memory(const test::TempDir& nvme) {
  StrategyConfig c;
  c.nvme_path = nvme.path().string();
  c.optimizer_buffer_count = nvme_buffers_per_sub_group(1);
  return c;
}
}  // namespace

TEST_CASE("memory: under NVMe offload, sub_group_size bounds the optimizer state a step brings back",
          "[engine][memory]") {
  using Infinity = InfinityPerBlock;
  test::TempDir nvme;
  const StrategyConfig whole = one_sub_group_in_memory(nvme);
  StrategyConfig pieces = whole;
  pieces.sub_group_size = 100;  // a block's shard is 2,197 elements at world size 1, 733 at 3
  const auto check = [&]<class S>(S, const char* label) {
    for (int world : {1, 3}) {
      INFO(label << " at world size " << world);
      for (const Held& h : hold<S>(world, pieces)) {
        const StepPeakMemory peak = host_step_peak_memory<S>(h.units, world, 1, pieces, h.buckets);
        CHECK(double(h.peak_at(MemoryCategory::OptimizerState)) == peak.optimizer_state);
        CHECK(peak.optimizer_state < host_step_peak_memory<S>(h.units, world, 1, whole, h.buckets).optimizer_state);
      }
    }
  };
  check(Infinity{}, "OffloadOptimizer<Nvme>");
  check(with_t<Infinity, Bf16Mixed>{}, "OffloadOptimizer<Nvme>, bf16: the masters come back with the moments");
  check(OnNvme{}, "OffloadParameters<Nvme>");
  check(with_t<OnNvme, Bf16Mixed>{}, "OffloadParameters<Nvme>, bf16");
}

TEST_CASE("memory: building the engine under NVMe offload holds one unit's state and shard on top of what it keeps, "
          "never the whole model's",
          "[engine][memory]") {
  test::TempDir nvme;
  const StrategyConfig config = one_sub_group_in_memory(nvme);
  StrategyConfig all_in_file = config;
  all_in_file.max_in_cpu = 0;
  StrategyConfig keep_root = config;
  keep_root.max_in_cpu = 400;  // the root's shard (299 elements and padding) stays in memory, no block's does
  const auto check = [&]<class S>(S, const StrategyConfig& c, const char* label) {
    using MT = typename S::master_type;
    for (int world : {1, 3}) {
      INFO(label << " at world size " << world << ", max_in_cpu " << c.max_in_cpu);
      for (const Held& h : hold<S>(world, c)) {
        const StepPeakMemory built = host_construction_peak_memory<S>(h.units, world, 1, c);
        CHECK(double(h.built_peak_at(MemoryCategory::Parameters)) == built.parameters);
        CHECK(double(h.built_peak_at(MemoryCategory::OptimizerState)) == built.optimizer_state);
        // Every unit built before any went to the file would hold all five units' momentum; one
        // unit's is held, its masters twice in bf16 while they are copied into its sub-groups.
        double all_momentum = 0, largest = 0;
        for (const std::int64_t u : h.units) {
          all_momentum += double(sizeof(MT) * u / world);
          largest = std::max(largest, double(sizeof(MT) * u / world));
        }
        CHECK(double(h.built_peak_at(MemoryCategory::OptimizerState)) <= largest * 3);  // bf16: the masters twice
        CHECK(double(h.built_peak_at(MemoryCategory::OptimizerState)) < all_momentum);
        if constexpr (S::offload::offloads_parameters) {
          const std::size_t kept = nvme_units_in_memory(h.units, world, c.max_in_cpu);
          CHECK(kept == (c.max_in_cpu > 0 ? 1u : 0u));
          // The kept shards, and one block's shard being written.
          const double element = sizeof(typename S::compute_type);
          CHECK(double(h.built_peak_at(MemoryCategory::Parameters)) ==
                element * double((kept ? h.units[0] : 0) / world + h.units[1] / world));
        }
      }
    }
  };
  check(InfinityPerBlock{}, config, "OffloadOptimizer<Nvme>");
  check(with_t<InfinityPerBlock, Bf16Mixed>{}, config, "OffloadOptimizer<Nvme>, bf16: the masters with the moments");
  check(OnNvme{}, all_in_file, "OffloadParameters<Nvme>");
  check(OnNvme{}, keep_root, "OffloadParameters<Nvme>, the root kept in memory");
  check(with_t<OnNvme, Bf16Mixed>{}, keep_root, "OffloadParameters<Nvme>, bf16, the root kept in memory");
}

TEST_CASE("memory: under NVMe offload, parameters exempt from weight decay cut the sub-groups, and the prediction "
          "follows the engine's",
          "[engine][memory]") {
  using Infinity = InfinityPerBlock;
  test::TempDir nvme;
  const StrategyConfig config = one_sub_group_in_memory(nvme);
  const auto check = [&]<class S>(S, const char* label) {
    for (int world : {1, 3}) {
      INFO(label << " at world size " << world);
      for (const Held& h : hold<S>(world, config, /*matrices_only=*/true)) {
        // A block's shard is cut where its biases and norms start and end: more groups than units.
        CHECK(h.sub_groups.size() > h.units.size());
        const double measured = double(h.peak_at(MemoryCategory::OptimizerState));
        CHECK(measured == host_step_peak_memory<S>(h.units, world, 1, config, h.buckets, h.sub_groups).optimizer_state);
        // Each unit's shard taken whole would predict its largest shard, which no group now is.
        CHECK(measured < host_step_peak_memory<S>(h.units, world, 1, config, h.buckets).optimizer_state);
      }
    }
  };
  check(Infinity{}, "OffloadOptimizer<Nvme>");
  check(with_t<Infinity, Bf16Mixed>{}, "OffloadOptimizer<Nvme>, bf16: the masters come back with the moments");
  check(OnNvme{}, "OffloadParameters<Nvme>");
}
#endif

namespace {
/// Each unit's activation bytes on every rank after a step of `world` ranks, and the rows each had.
template <class S>
std::vector<std::pair<std::int64_t, std::vector<std::int64_t>>> activations(int world, std::int64_t* peak_total = nullptr) {
  std::vector<std::pair<std::int64_t, std::vector<std::int64_t>>> out(static_cast<std::size_t>(world));
  std::vector<std::int64_t> peaks(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    comm.set_memory_tracker(tracker);
    {
      Gpt<float> model(four_blocks());
      const SgdConfig sgd = test::momentum_sgd();
      Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, sgd, {}, 42);
      BatchSampler sampler(test::tiny_data(), 8, 8, 7);
      const Batch b = sampler.batch(0, comm.rank(), world);
      tracker.reset_peaks();
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, double(b.inputs.size(0)) / 8.0);
      loss = Var<float>();
      engine.step(sgd.lr);
      out[static_cast<std::size_t>(comm.rank())] = {b.inputs.size(0), engine.activation_bytes()};
      peaks[static_cast<std::size_t>(comm.rank())] = tracker.peak(MemoryCategory::Activations);
    }
    comm.set_memory_tracker(detail::process_tracker());
  });
  if (peak_total) *peak_total = peaks[0];
  return out;
}
}  // namespace

TEST_CASE("memory: each unit reports the activations its forward keeps, a checkpointed block keeps its output only",
          "[engine][memory]") {
  using ByBlock = Strategy<ShardParameters<true>, WrapByType<Block>>;
  using Checkpointed = Strategy<ShardParameters<true>, WrapByType<Block>, ActivationCheckpointing<Block>>;
  const GptConfig cfg = four_blocks();
  const std::int64_t row = cfg.block_size * cfg.n_embd * std::int64_t(sizeof(float));  // one row's (T, C) output
  std::int64_t peak = 0;
  const auto whole = activations<ByBlock>(1, &peak);
  const std::vector<std::int64_t>& one = whole[0].second;  // 8 rows
  REQUIRE(one.size() == 5);
  std::int64_t kept = 0;
  for (std::size_t u = 0; u < one.size(); ++u) {
    CHECK(one[u] > 0);
    kept += one[u];
  }
  for (std::size_t u = 2; u < one.size(); ++u) CHECK(one[u] == one[1]);  // the blocks are alike
  CHECK(kept <= peak);  // what forward kept is live at the end of forward
  // Activations do not depend on the strategy: DDP and bf16 ZeRO-3 (a host computes in float).
  CHECK(activations<Strategy<NoShard, WrapByType<Block>>>(1)[0].second == one);
  CHECK(activations<Strategy<ShardParameters<true>, WrapByType<Block>, Bf16Mixed>>(1)[0].second == one);
  // A block's activations are proportional to its rows: 3, 3 and 2 of them at world size 3.
  for (const auto& [rows, units] : activations<ByBlock>(3))
    for (std::size_t u = 1; u < units.size(); ++u) CHECK(units[u] * 8 == one[u] * rows);
  // A checkpointed block keeps only its (rows, T, C) output; its forward is recomputed in backward.
  for (int world : {1, 3})
    for (const auto& [rows, units] : activations<Checkpointed>(world)) {
      INFO("world size " << world << ", " << rows << " rows");
      REQUIRE(units.size() == 5);
      for (std::size_t u = 1; u < units.size(); ++u) CHECK(units[u] == rows * row);
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
