// Training throughput on the CPU of a small GPT and of examples/08-own-model's Llama-style model
// at the same width: tokens/s of a full step (forward, backward, AdamW), and model FLOP
// utilisation against the FMA peak measured in the same run.
#include <thread>

#include "polyshard/data/data.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "llama.hpp"  // examples/08-own-model
#include "support/report.hpp"

using namespace polyshard;

int main(int argc, char** argv) {
  const auto args = bench::parse_args(argc, argv, "bench_train.json");
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  cpu::set_blas_threads(threads);
  const double peak = bench::measure_fma_peak_gflops(threads);
  std::printf("fp32 FMA peak (%s), %d threads: %.1f GFLOP/s\n", bench::fma_peak_instructions(), threads, peak);

  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  struct Case {
    std::int64_t layers, heads, embd, seq, batch;
    bool checkpoint;
  };
  std::vector<Case> cases = {{4, 4, 128, 64, 16, false}, {4, 4, 128, 64, 16, true}, {6, 8, 256, 128, 8, false}};
  if (args.quick) cases.resize(1);
  bench::Table table("Training step on the CPU (fp32, AdamW): GPT-2 and a Llama-style model of the same width");
  // One step of `model` (its loss over a batch, backward, AdamW over its flat parameters) timed;
  // model FLOPs per token: 6 per multiplying parameter (forward + backward) plus attention's 6 L C T.
  auto measure = [&](const std::string& name, auto& model, const Case& c, double multiplying_parameters) {
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
    const double flops_per_token = 6.0 * multiplying_parameters + 6.0 * double(c.layers * c.embd * c.seq);
    const double tps = tokens / seconds;
    table.row()
        .set("model", name + " L" + std::to_string(c.layers) + " C" + std::to_string(c.embd) + " T" +
                          std::to_string(c.seq) + " B" + std::to_string(c.batch) + (c.checkpoint ? " ckpt" : ""))
        .set("parameters", double(params.numel()), 0)
        .set("step ms", seconds * 1e3)
        .set("tokens/s", tps, 0)
        .set("MFU %", 100.0 * tps * flops_per_token / 1e9 / peak)
        .set("peak activations MiB", double(memory.peak(MemoryCategory::Activations)) / (1 << 20));
  };
  for (const Case& c : cases) {
    GptConfig cfg{.vocab_size = 256, .block_size = c.seq, .n_layer = c.layers, .n_head = c.heads, .n_embd = c.embd};
    Gpt<float> gpt(cfg);
    gpt.checkpoint_blocks = c.checkpoint;
    // The tied head counted once more (the embedding lookup does no multiplies).
    measure("GPT-2", gpt, c, double(count_parameters(gpt)) + double(256 * c.embd));
    if (c.checkpoint) continue;  // the Llama example has no checkpointing switch of its own
    // Llama's proportions at the same width: half as many key-value heads, a SwiGLU hidden
    // size of 8/3 C (three matrices holding what GPT-2's two of 4 C hold).
    const own::LlamaConfig lc{.vocab_size = 256, .hidden_size = c.embd, .intermediate_size = 8 * c.embd / 3,
                              .num_hidden_layers = int(c.layers), .num_attention_heads = int(c.heads),
                              .num_key_value_heads = int(c.heads / 2), .max_position_embeddings = c.seq};
    own::Llama llama(lc);
    // Every parameter multiplies but the embedding's; the untied head is a parameter of its own.
    measure("Llama", llama, c, double(count_parameters(llama)) - double(256 * c.embd));
  }
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
