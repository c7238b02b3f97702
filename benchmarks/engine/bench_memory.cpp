// Every preset at world sizes 1 to 8 on the GPT, ranks as threads: the most memory a rank holds
// within a steady-state step, per category, measured by its tracker beside host_step_peak_memory's
// prediction (policy/step_memory.hpp; the in-process backend keeps no scratch of its own,
// docs/communication.md), what it holds between steps beside resident_memory's, and the
// activations each unit's forward keeps (Engine::activation_bytes()); and the most it held while
// the engine was built beside host_construction_peak_memory's (under NVMe offload, one unit's
// state and shard at a time).
#include <filesystem>
#include <mutex>

#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/data/data.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "polyshard/policy/policy.hpp"
#include "polyshard/policy/step_memory.hpp"
#include "support/report.hpp"

using namespace polyshard;

namespace {

constexpr std::array<MemoryCategory, 6> categories = {MemoryCategory::Parameters,    MemoryCategory::Gradients,
                                                      MemoryCategory::OptimizerState, MemoryCategory::WorkingCopies,
                                                      MemoryCategory::Communication, MemoryCategory::Other};

struct RankMemory {
  std::array<double, 6> peak{}, predicted_peak{}, held{}, predicted_held{}, built{}, predicted_built{};
  std::int64_t block_activations = 0, root_activations = 0;
};

template <class S>
std::vector<RankMemory> measure(int world, const GptConfig& cfg, std::int64_t batch, const StrategyConfig& config) {
  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  std::vector<RankMemory> out(static_cast<std::size_t>(world));
  set_optimizer_threads(world > 1 ? 1 : 0);
  run_ranks(world, [&](ThreadCommunicator& comm) {
    MemoryTracker memory;
    TrackerScope scope(memory);
    comm.set_memory_tracker(memory);
    {
      Gpt<float> model(cfg);
      Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{}, config, 1);
      RankMemory& r = out[static_cast<std::size_t>(comm.rank())];
      for (std::size_t c = 0; c < categories.size(); ++c) r.built[c] = double(memory.peak(categories[c]));
      const BatchSampler sampler(data, cfg.block_size, batch, 3);
      for (int step = 0; step < 3; ++step) {
        if (step == 2) memory.reset_peaks();  // steady state: prefetch knows the order, the state exists
        const Batch b = sampler.batch(step, comm.rank(), world);
        engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }),
                        double(b.inputs.size(0)) / double(batch));
        engine.step(1e-3);
      }
      std::vector<std::int64_t> units;
      std::vector<std::size_t> buckets;
      for (std::size_t i = 0; i < engine.units().units.size(); ++i) {
        units.push_back(engine.units().units[i].padded);
        buckets.push_back(engine.gradient_buckets(i).size());
      }
      const std::vector<std::int64_t> shards = engine.units().uneven_shards(comm.rank(), world);
      const StepPeakMemory p = host_step_peak_memory<S>(units, world, 2, config, buckets, {}, shards);
      const ResidentMemory h = resident_memory<S>(units, world, 2, config, shards);
      const StepPeakMemory b = host_construction_peak_memory<S>(units, world, 2, config, shards);
      r.predicted_peak = {p.parameters, p.gradients, p.optimizer_state, p.working_copies, p.communication,
                          p.other};
      r.predicted_held = {h.parameters, h.gradients, h.optimizer_state, h.working_copies, 0.0, h.other};
      r.predicted_built = {b.parameters, b.gradients, b.optimizer_state, b.working_copies, b.communication, b.other};
      for (std::size_t c = 0; c < categories.size(); ++c) {
        r.peak[c] = double(memory.peak(categories[c]));
        r.held[c] = double(memory.current(categories[c]));
      }
      r.root_activations = engine.activation_bytes().at(0);
      r.block_activations = engine.activation_bytes().at(1);
    }
    comm.set_memory_tracker(detail::process_tracker());
  });
  return out;
}

template <class S>
void row(bench::Table& table, const char* name, int world, const GptConfig& cfg, std::int64_t batch,
         StrategyConfig config = {}) {
  // One sub-group's state (and one unit's masters) in memory at a time: an exact peak.
  if constexpr (S::offload::to_nvme) config.optimizer_buffer_count = nvme_buffers_per_sub_group(2);  // AdamW
  if constexpr (S::offload::to_nvme && S::offload::offloads_parameters) {
    config.params_buffer_count = 1;  // and one unit's parameter shard read in at a time
    config.max_in_cpu = 0;           // every shard in the file
  }
  const std::vector<RankMemory> ranks = measure<S>(world, cfg, batch, config);
  // The largest difference between measurement and prediction over every rank and category.
  double peak_error = 0, held_error = 0, built_error = 0;
  for (const RankMemory& r : ranks)
    for (std::size_t c = 0; c < categories.size(); ++c) {
      peak_error = std::max(peak_error, std::abs(r.peak[c] - r.predicted_peak[c]));
      held_error = std::max(held_error, std::abs(r.held[c] - r.predicted_held[c]));
      built_error = std::max(built_error, std::abs(r.built[c] - r.predicted_built[c]));
    }
  const RankMemory& r0 = ranks[0];
  const auto kib = [](double bytes) { return bytes / 1024; };
  table.row().set("strategy", name).set("world", double(world), 0);
  const char* short_names[] = {"param", "grad", "optim", "work", "comm", "other"};
  for (std::size_t c = 0; c < categories.size(); ++c)
    table.set(std::string(short_names[c]) + " peak KiB", kib(r0.peak[c]))
        .set(std::string(short_names[c]) + " predicted", kib(r0.predicted_peak[c]));
  table.set("max |peak - predicted| B", peak_error, 0)
      .set("max |held - predicted| B", held_error, 0)
      .set("built param KiB", kib(r0.built[0]))
      .set("built optim KiB", kib(r0.built[2]))
      .set("max |built - predicted| B", built_error, 0)
      .set("root act KiB", kib(double(r0.root_activations)))
      .set("block act KiB", kib(double(r0.block_activations)));
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = bench::parse_args(argc, argv, "bench_memory.json");
  const GptConfig cfg{.vocab_size = 256, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128};
  const std::int64_t batch = 16;
  using PerBlock = WrapByType<Block>;
  bench::Table table("peak memory within a step, per category, rank 0 (KiB), on GPT L4 C128 T64, global batch 16, "
                     "AdamW, ranks as threads; the error columns cover every rank");
  for (int world = 1; world <= 8; ++world) {
    row<Strategy<NoShard, PerBlock>>(table, "ddp", world, cfg, batch);
    row<Strategy<ShardOptimizerState, PerBlock>>(table, "zero1", world, cfg, batch);
    row<Strategy<ShardGradients, PerBlock>>(table, "zero2", world, cfg, batch);
    // FairScale's OSS partition (ShardedDDP's): each parameter whole on one rank, each rank's
    // shard of its own size.
    StrategyConfig whole;
    whole.partition = ShardPartition::whole_parameters;
    row<Strategy<ShardGradients, PerBlock>>(table, "zero2 whole_parameters", world, cfg, batch, whole);
    row<Strategy<ShardParameters<true>, PerBlock>>(table, "zero3", world, cfg, batch);
    row<Strategy<ShardParameters<false>, PerBlock>>(table, "fsdp_grad_op", world, cfg, batch);
    row<Strategy<ShardGradients, OffloadOptimizer<Cpu>, PerBlock>>(table, "zero_offload", world, cfg, batch);
    row<Strategy<ShardParameters<true>, OffloadParameters<Cpu>, PerBlock>>(table, "zero3_offload", world, cfg, batch);
    row<Strategy<ShardGradients, Bf16Mixed, PerBlock>>(table, "zero2 bf16", world, cfg, batch);
    row<Strategy<ShardParameters<true>, Bf16Mixed, PerBlock>>(table, "zero3 bf16", world, cfg, batch);
    // allgather_bucket_size: the write-back all-gathers 16,384 elements at a time, not a shard.
    StrategyConfig gathered_in_pieces;
    gathered_in_pieces.allgather_bucket_size = 16'384;
    row<Strategy<ShardGradients, PerBlock>>(table, "zero2 allgather_bucket 16384", world, cfg, batch,
                                            gathered_in_pieces);
#ifdef POLYSHARD_HAVE_LIBURING
    StrategyConfig nvme;  // AdamW's state in a file per rank under the temporary directory
    nvme.nvme_path = std::filesystem::temp_directory_path().string();
    row<Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, PerBlock>>(table, "zero_infinity", world, cfg, batch,
                                                                           nvme);
    // Mixed precision: the fp32 masters go to the file with the moments.
    row<Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, Bf16Mixed, PerBlock>>(table, "zero_infinity bf16",
                                                                                      world, cfg, batch, nvme);
    row<Strategy<ShardParameters<true>, OffloadParameters<Nvme>, PerBlock>>(table, "zero_infinity_parameters", world,
                                                                            cfg, batch, nvme);
    // sub_group_size: the moments come back 16,384 elements at a time, not a unit's shard at once.
    StrategyConfig pieces = nvme;
    pieces.sub_group_size = 16'384;
    row<Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, PerBlock>>(table, "zero_infinity sub_group 16384",
                                                                           world, cfg, batch, pieces);
    row<Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, Bf16Mixed, PerBlock>>(
        table, "zero_infinity bf16 sub_group 16384", world, cfg, batch, pieces);
#endif
  }
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
