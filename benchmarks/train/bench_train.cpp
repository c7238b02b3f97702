// Training throughput of a small GPT on the CPU: tokens/s of a full step (forward, backward,
// AdamW), and model FLOP utilisation against the FMA peak measured in the same run.
#include <thread>

#include "polyshard/data/data.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "support/report.hpp"

using namespace polyshard;

int main(int argc, char** argv) {
  const auto args = bench::parse_args(argc, argv, "bench_train.json");
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  cpu::set_blas_threads(threads);
  const double peak = bench::measure_fma_peak_gflops(threads);
  std::printf("fp32 FMA peak, %d threads: %.1f GFLOP/s\n", threads, peak);

  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  struct Case {
    std::int64_t layers, heads, embd, seq, batch;
    bool checkpoint;
  };
  std::vector<Case> cases = {{4, 4, 128, 64, 16, false}, {4, 4, 128, 64, 16, true}, {6, 8, 256, 128, 8, false}};
  if (args.quick) cases.resize(1);
  bench::Table table("GPT training step (fp32, AdamW)");
  for (const Case& c : cases) {
    GptConfig cfg{.vocab_size = 256, .block_size = c.seq, .n_layer = c.layers, .n_head = c.heads, .n_embd = c.embd};
    Gpt<float> model(cfg);
    model.checkpoint_blocks = c.checkpoint;
    FlatParameters<float> params(model);
    params.initialize(1);
    AdamW<float> opt(AdamWConfig{}, std::size_t(params.padded_numel()));
    BatchSampler sampler(data, c.seq, c.batch, 3);
    std::int64_t step = 0;
    MemoryTracker& memory = current_memory_tracker();
    memory.reset_peaks();
    const double seconds = bench::median_seconds(
        [&] {
          const Batch b = sampler.batch(step++);
          params.zero_grad();
          backward(model.loss(b.inputs, b.targets));
          params.settle_grads();
          opt.step(params.values().span(), std::span<const float>(params.grads().span()));
        },
        args.quick ? 3 : 10, 2);
    const double tokens = double(c.batch * c.seq);
    // Model FLOPs per token: 6 per parameter (forward + backward) plus attention's 6 L C T,
    // with the tied head counted once more (the embedding lookup does no multiplies).
    const double n = double(params.numel()) + double(256 * c.embd);
    const double flops_per_token = 6.0 * n + 6.0 * double(c.layers * c.embd * c.seq);
    const double tps = tokens / seconds;
    table.row()
        .set("model", "L" + std::to_string(c.layers) + " C" + std::to_string(c.embd) + " T" + std::to_string(c.seq) +
                          " B" + std::to_string(c.batch) + (c.checkpoint ? " ckpt" : ""))
        .set("parameters", double(params.numel()), 0)
        .set("step ms", seconds * 1e3)
        .set("tokens/s", tps, 0)
        .set("MFU %", 100.0 * tps * flops_per_token / 1e9 / peak)
        .set("peak activations MiB", double(memory.peak(MemoryCategory::Activations)) / (1 << 20));
  }
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
