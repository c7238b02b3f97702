// Every preset at world sizes 1 to 8 on the GPT, ranks as threads: step time, tokens/s,
// model-state and peak bytes per rank, and the bytes rank 0 moved per step (measured by the
// backend) beside the bytes it sent by the ring formula and the strategy's formula.
#include <filesystem>
#include <mutex>
#include <thread>

#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/data/data.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "polyshard/policy/policy.hpp"
#include "support/report.hpp"

using namespace polyshard;

namespace {

struct Figures {
  double step_s = 0, model_state = 0, peak = 0, bytes = 0, moved = 0, predicted_bytes = 0, predicted_state = 0;
};

template <class S>
Figures measure(int world, const GptConfig& cfg, std::int64_t batch, int steps, const StrategyConfig& config) {
  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  Figures out;
  std::mutex mutex;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  cpu::set_blas_threads(std::max(1, cores / world));
  set_optimizer_threads(world > 1 ? 1 : 0);
  run_ranks(world, [&](ThreadCommunicator& comm) {
    MemoryTracker memory;
    TrackerScope scope(memory);
    Gpt<float> model(cfg);
    Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{}, config, 1);
    const BatchSampler sampler(data, cfg.block_size, batch, 3);
    std::vector<double> times;
    double bytes = 0, moved = 0;
    for (int step = 0; step < steps; ++step) {
      comm.barrier();  // start each step together, so the time is the step's, not a straggler's
      memory.reset_peaks();
      comm.stats().reset();
      const auto t0 = std::chrono::steady_clock::now();
      const Batch b = sampler.batch(step, comm.rank(), world);
      const double weight = double(b.inputs.size(0)) / double(batch);
      engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }), weight);
      engine.step(1e-3);
      comm.barrier();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      bytes = comm.stats().total_bytes_sent();  // barriers send nothing
      moved = comm.stats().total_bytes_moved();
    }
    std::sort(times.begin(), times.end());
    if (comm.rank() != 0) return;
    std::lock_guard lock(mutex);
    out.step_s = times[times.size() / 2];
    out.model_state = double(memory.current(MemoryCategory::Parameters) + memory.current(MemoryCategory::Gradients) +
                             memory.current(MemoryCategory::OptimizerState));
    out.peak = double(memory.peak_total());
    out.bytes = bytes;
    out.moved = moved;
    const auto& plan = engine.units();
    out.predicted_bytes = bytes_sent_per_step<S>(plan.padded_total(), plan.units[0].padded, world);
    out.predicted_state = model_state_bytes<S>(plan.padded_total(), world);
  });
  return out;
}

template <class S>
void row(bench::Table& table, const char* name, int world, const GptConfig& cfg, std::int64_t batch, int steps,
         double& ddp_step, const StrategyConfig& config = {}) {
  const Figures f = measure<S>(world, cfg, batch, steps, config);
  if (std::string(name) == "ddp") ddp_step = f.step_s;
  table.row()
      .set("strategy", name)
      .set("world", double(world), 0)
      .set("step ms", f.step_s * 1e3)
      .set("vs ddp", f.step_s / ddp_step, 2)
      .set("tokens/s", double(batch * cfg.block_size) / f.step_s, 0)
      .set("model state MiB/rank", f.model_state / (1 << 20), 2)
      .set("formula MiB", f.predicted_state / (1 << 20), 2)
      .set("peak MiB/rank", f.peak / (1 << 20), 2)
      .set("moved MiB/rank/step", f.moved / (1 << 20), 3)
      .set("sent MiB/rank/step", f.bytes / (1 << 20), 3)
      .set("formula sent MiB", f.predicted_bytes / (1 << 20), 3);
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = bench::parse_args(argc, argv, "bench_strategies.json");
  const GptConfig cfg{.vocab_size = 256, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128};
  const std::int64_t batch = 16;
  const int steps = args.quick ? 4 : 12;
  using PerBlock = WrapByType<Block>;
  bench::Table table("strategies on GPT L4 C128 T64, global batch 16, AdamW, ranks as threads");
  for (int world = 1; world <= 8; ++world) {
    double ddp_step = 0;
    row<Strategy<NoShard, PerBlock>>(table, "ddp", world, cfg, batch, steps, ddp_step);
    row<Strategy<ShardOptimizerState, PerBlock>>(table, "zero1", world, cfg, batch, steps, ddp_step);
    row<Strategy<ShardGradients, PerBlock>>(table, "zero2", world, cfg, batch, steps, ddp_step);
    row<Strategy<ShardParameters<true>, PerBlock>>(table, "zero3", world, cfg, batch, steps, ddp_step);
    row<Strategy<ShardParameters<false>, PerBlock>>(table, "fsdp_grad_op", world, cfg, batch, steps, ddp_step);
    row<Strategy<ShardGradients, Bf16Mixed, PerBlock>>(table, "zero2 bf16", world, cfg, batch, steps, ddp_step);
#ifdef POLYSHARD_HAVE_LIBURING
    // ZeRO-Infinity: AdamW's state in a file per rank under the temporary directory.
    StrategyConfig nvme;
    nvme.nvme_path = std::filesystem::temp_directory_path().string();
    row<Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, PerBlock>>(table, "zero_infinity", world, cfg, batch,
                                                                           steps, ddp_step, nvme);
    // And the parameter shards and masters there too, every one in the file (max_in_cpu 0), with
    // DeepSpeed's five parameter buffers.
    StrategyConfig parameters = nvme;
    parameters.max_in_cpu = 0;
    row<Strategy<ShardParameters<true>, OffloadParameters<Nvme>, PerBlock>>(table, "zero_infinity_parameters", world,
                                                                            cfg, batch, steps, ddp_step, parameters);
#endif
  }
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
