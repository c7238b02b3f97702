// A model of one's own under every preset: the Llama-style decoder of llama.hpp trains on the
// built-in corpus under each strategy at world sizes 1 and 3 (threads as ranks), and every run
// must end on the losses of one process training it with DDP: fp32 strategies to 1e-5, bf16 to
// the tolerance below. Exits 1 if one does not.
//
//   polyshard-own-model                 every preset, world sizes 1 and 3
//   polyshard-own-model --export DIR    also writes DIR/model.safetensors and DIR/config.json (a
//                                       save_pretrained directory LlamaForCausalLM loads) and
//                                       DIR/check.safetensors (input ids, the logits this
//                                       program computes and a greedy generation), for check_hf.py;
//                                       and one batch's gradient under ZeRO-3 at world size 3
//                                       (gradient_before/after.safetensors: the weights around one
//                                       SGD step at learning rate 1, gradient_batch.safetensors: the
//                                       batch and its loss), for check_numpy_oracle.py
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "llama.hpp"

using namespace polyshard;
using own::DecoderLayer;
using own::Llama;
using own::LlamaConfig;

namespace {

constexpr std::int64_t kBatch = 8;
constexpr int kSteps = 12;
constexpr double kLr = 3e-3;

/// bf16 keeps 8 significant bits: each step's loss is computed from parameters rounded to
/// 2^-9 relative and gradients reduced in bf16, so it strays from fp32's by some multiple of
/// that roundoff (2^-9 = 2e-3). The 12 steps here stray by 5.3e-4 at most; 5e-3 leaves a margin
/// of ten, and stays far under the loss's fall over the run (35%), so a strategy that trains
/// wrong still fails.
constexpr double kBf16Tolerance = 5e-3;
constexpr double kFp32Tolerance = 1e-5;

/// The sum over ranks of each step's rank-weighted loss: the global batch's mean loss.
template <class S>
std::vector<double> train(const LlamaConfig& config, const TextDataset& data, int world,
                          const std::filesystem::path& export_dir = {}) {
  std::vector<std::vector<double>> losses(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Llama model(config);
    Engine<S, Llama, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{.lr = kLr, .weight_decay = 0.1},
                                                              {}, /*seed=*/7);
    const BatchSampler sampler(data, config.max_position_embeddings, kBatch, /*seed=*/1);
    const RowRange rows = rank_rows(kBatch, comm.rank(), world);
    const double weight = double(rows.end - rows.begin) / double(kBatch);
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      losses[static_cast<std::size_t>(comm.rank())].push_back(loss.item() * weight);
      engine.backward(loss, weight);
      engine.step(kLr);
    }
    if (!export_dir.empty()) {
      save_full_weights(engine, export_dir / "model.safetensors");
      const Batch b = sampler.batch(kSteps, 0, 1);
      NoGradGuard no_grad;
      const Var<float> logits = engine.forward([&] { return model.logits(b.inputs); });
      // Greedy generation through the engine with the model's key-value cache: check_hf.py
      // recomputes every prefix in full and checks that each token is its most likely next one.
      const std::vector<std::int32_t> prompt(b.inputs.data(), b.inputs.data() + 8);
      const std::vector<std::int32_t> generated = generate(engine, model, prompt, {.new_tokens = 20, .temperature = 0});
      if (comm.rank() == 0) {
        SafetensorsWriter()
            .add("input_ids", b.inputs)
            .add("logits", logits.value())
            .add("generated", Tensor<std::int32_t>::from({std::int64_t(generated.size())}, generated))
            .write(export_dir / "check.safetensors");
        std::printf("generated after 12 steps: \"%s\"\n", ByteTokenizer::decode(generated).c_str());
      }
    }
  });
  std::vector<double> total(kSteps, 0.0);
  for (const auto& rank : losses)
    for (int s = 0; s < kSteps; ++s) total[std::size_t(s)] += rank[std::size_t(s)];
  return total;
}

/// One batch's gradient of the mean loss, as an oracle outside polyshard can check it: ZeRO-3 at
/// world size 3 takes one SGD step at learning rate 1 from the initial weights, so each weight
/// moves by minus its gradient of the global batch's mean loss. Writes the full weights before
/// and after, and the batch with its loss.
void export_gradient(const LlamaConfig& config, const TextDataset& data, const std::filesystem::path& dir) {
  constexpr int world = 3;
  std::vector<double> losses(world, 0.0);
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Llama model(config);
    Engine<ZeRO<3>, Llama, ThreadCommunicator, Sgd<float>> engine(model, comm, SgdConfig{.lr = 1.0}, {}, /*seed=*/7);
    const BatchSampler sampler(data, config.max_position_embeddings, kBatch, /*seed=*/1);
    const RowRange rows = rank_rows(kBatch, comm.rank(), world);
    const double weight = double(rows.end - rows.begin) / double(kBatch);
    save_full_weights(engine, dir / "gradient_before.safetensors");
    const Batch b = sampler.batch(0, comm.rank(), world);
    Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
    losses[static_cast<std::size_t>(comm.rank())] = loss.item() * weight;
    engine.backward(loss, weight);
    engine.step(1.0);
    save_full_weights(engine, dir / "gradient_after.safetensors");
  });
  double total = 0;
  for (const double l : losses) total += l;
  const Batch whole = BatchSampler(data, config.max_position_embeddings, kBatch, /*seed=*/1).batch(0, 0, 1);
  SafetensorsWriter()
      .add("input_ids", whole.inputs)
      .add("targets", whole.targets)
      .add("loss", Tensor<double>::from({1}, std::vector<double>{total}))
      .write(dir / "gradient_batch.safetensors");
}

/// config.json as Hugging Face's LlamaConfig reads it.
void write_config(const LlamaConfig& c, const std::filesystem::path& path) {
  std::ofstream out(path);
  out << "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
      << "  \"vocab_size\": " << c.vocab_size << ",\n  \"hidden_size\": " << c.hidden_size
      << ",\n  \"intermediate_size\": " << c.intermediate_size << ",\n  \"num_hidden_layers\": " << c.num_hidden_layers
      << ",\n  \"num_attention_heads\": " << c.num_attention_heads
      << ",\n  \"num_key_value_heads\": " << c.num_key_value_heads << ",\n  \"rms_norm_eps\": " << c.rms_norm_eps
      << ",\n  \"rope_theta\": " << c.rope_theta << ",\n  \"max_position_embeddings\": " << c.max_position_embeddings
      << ",\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
      << "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"float32\"\n}\n";
  POLYSHARD_CHECK(out.good(), "could not write ", path.string());
}

// [strategies]
using ByLayer = WrapByClass<DecoderLayer>;  // a plain struct of this example: WrapByClass
using Presets =
    std::tuple<DDP, ShardedDDP, ZeRO<1>, ZeRO<2>, ZeRO<3>, FSDP, ZeROOffload, Strategy<ShardParameters<true>, ByLayer>,
               Strategy<ShardParameters<true>, ByLayer, ActivationCheckpointingByClass<DecoderLayer>>,
               Strategy<ShardParameters<false>, ByLayer, OffloadParameters<Cpu>>,
               Strategy<ShardParameters<true>, Bf16Mixed, ByLayer>, Strategy<ShardGradients, Bf16Mixed>>;
// [strategies]

const char* preset_name(std::size_t i) {
  static const char* names[] = {"DDP",
                                "ShardedDDP",
                                "ZeRO-1",
                                "ZeRO-2",
                                "ZeRO-3",
                                "FSDP (by size)",
                                "ZeRO-Offload",
                                "FSDP by layer",
                                "FSDP by layer, checkpointed",
                                "FSDP by layer, parameters offloaded",
                                "FSDP by layer, bf16 mixed",
                                "ZeRO-2, bf16 mixed"};
  return names[i];
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t s = 0; s < a.size(); ++s) worst = std::max(worst, std::abs(a[s] - b[s]) / std::abs(b[s]));
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path export_dir;
  // --part K/N: the presets I with I % N == K - 1 only (CTest runs the parts side by side).
  int part = 1, parts = 1;
  for (int i = 1; i < argc; ++i) {
    char slash = 0;
    int end = 0;
    if (std::strcmp(argv[i], "--export") == 0 && i + 1 < argc) {
      export_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--part") == 0 && i + 1 < argc &&
               std::sscanf(argv[i + 1], "%d%c%d%n", &part, &slash, &parts, &end) == 3 && slash == '/' &&
               argv[i + 1][end] == '\0' && parts >= 1 && part >= 1 && part <= parts) {
      ++i;
    } else {
      std::fprintf(stderr, "usage: %s [--export DIR] [--part K/N (1 <= K <= N)]\n", argv[0]);
      return 2;
    }
  }
  const LlamaConfig config;
  const TextDataset data = TextDataset::from_text(builtin_corpus(1 << 16));
  try {
    if (!export_dir.empty()) {
      std::filesystem::create_directories(export_dir);
      write_config(config, export_dir / "config.json");
      export_gradient(config, data, export_dir);
    }
    const std::vector<double> reference = train<DDP>(config, data, 1, export_dir);
    std::printf("one process, DDP: loss %.4f at step 1, %.4f at step %d\n", reference.front(), reference.back(), kSteps);
    std::printf("%-38s %12s %12s %14s  %s\n", "strategy", "final, w=1", "final, w=3", "max rel. diff", "within");
    bool ok = reference.back() < 0.8 * reference.front();  // it learns
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (([&] {
         if (I % static_cast<std::size_t>(parts) != static_cast<std::size_t>(part - 1)) return;
         using S = std::tuple_element_t<I, Presets>;
         const double tolerance = std::is_same_v<typename S::compute_type, float> ? kFp32Tolerance : kBf16Tolerance;
         const std::vector<double> one = train<S>(config, data, 1), three = train<S>(config, data, 3);
         const double diff = std::max(max_relative_difference(one, reference), max_relative_difference(three, reference));
         const bool within = diff <= tolerance;
         ok = ok && within;
         std::printf("%-38s %12.6f %12.6f %14.2e  %s (%.0e)\n", preset_name(I), one.back(), three.back(), diff,
                     within ? "yes" : "NO", tolerance);
       }()),
       ...);
    }(std::make_index_sequence<std::tuple_size_v<Presets>>{});
    if (!export_dir.empty())
      std::printf("wrote %s: config.json, model.safetensors, check.safetensors, gradient_*.safetensors\n",
                  export_dir.c_str());
    if (!ok) {
      std::printf("own model: a strategy did not end on the one-process losses\n");
      return 1;
    }
    if (parts > 1) std::printf("(part %d of %d)\n", part, parts);
    std::printf("own model: every strategy ends on the one-process losses\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "polyshard-own-model: %s\n", e.what());
    return 1;
  }
}
