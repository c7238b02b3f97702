// Moving a run between strategies and out to PyTorch: ZeRO-3 on four ranks saves a sharded
// checkpoint, DDP on one rank resumes it, and the weights leave as one PyTorch state dict. The
// program checks each hand-over bit for bit and exits 1 if one differs.
//
//   polyshard-checkpoints [WORK_DIR]
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <polyshard/comm/thread_communicator.hpp>
#include <polyshard/data/data.hpp>
#include <polyshard/engine/engine.hpp>
#include <polyshard/io/io.hpp>
#include <polyshard/nn/nn.hpp>
#include <polyshard/optim/optim.hpp>
#include <polyshard/policy/policy.hpp>

using namespace polyshard;
namespace fs = std::filesystem;

namespace {

const GptConfig config{.vocab_size = 256, .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 32};
constexpr std::int64_t global_batch = 8;

using Weights = std::vector<std::pair<std::string, std::vector<float>>>;

/// Trains `engine` on this rank's rows from step `first` to `last`.
template <class E>
void train(E& engine, Gpt<float>& model, ThreadCommunicator& comm, const TextDataset& data, std::int64_t first,
           std::int64_t last) {
  const BatchSampler sampler(data, config.block_size, global_batch, /*seed=*/1);
  const RowRange rows = rank_rows(global_batch, comm.rank(), comm.size());
  const double share = double(rows.end - rows.begin) / double(global_batch);
  for (std::int64_t step = first; step < last; ++step) {
    const Batch b = sampler.batch(step, comm.rank(), comm.size());
    Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
    engine.backward(loss, share);
    engine.step(3e-3);
  }
}

bool same(const Weights& a, const Weights& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || a[i].second.size() != b[i].second.size() ||
        std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.size() * sizeof(float)) != 0)
      return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path work = argc > 1 ? fs::path(argv[1]) : fs::current_path();
  const TextDataset data = TextDataset::from_text(builtin_corpus(1 << 16));
  Weights zero3_weights, ddp_weights, ddp_after;

  // [save-sharded]
  // ZeRO-3 on 4 ranks: each rank writes the shards it owns, rank 0 the metadata.
  run_ranks(4, [&](ThreadCommunicator& comm) {
    Gpt<float> model(config);
    Engine<ZeRO<3>, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{.lr = 3e-3});
    train(engine, model, comm, data, 0, 10);
    save_checkpoint(engine, work / "zero3-checkpoint", {.step = 10, .seed = 1});
    // [save-sharded]
    const auto w = engine.full_parameters();
    if (comm.rank() == 0) zero3_weights = w;
  });

  // [resume-ddp]
  // DDP on 1 rank: reads every shard of every file; the optimizer state comes along.
  run_ranks(1, [&](ThreadCommunicator& comm) {
    Gpt<float> model(config);
    Engine<DDP, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{.lr = 3e-3});
    const TrainingState resumed = load_checkpoint(engine, work / "zero3-checkpoint");
    // [resume-ddp]
    ddp_weights = engine.full_parameters();
    // [continue]
    train(engine, model, comm, data, resumed.step, resumed.step + 5);
    save_full_weights(engine, work / "model.safetensors", tied_parameters<Gpt<float>>::of(model));
    // [continue]
    ddp_after = engine.full_parameters();
  });

  // [consolidate]
  // No engine, no ranks: the master weights of a sharded checkpoint as one state dict.
  Gpt<float> plain(config);
  consolidate_checkpoint(work / "zero3-checkpoint", work / "zero3-consolidated.safetensors",
                         tied_parameters<Gpt<float>>::of(plain));
  // [consolidate]

  // [state-dict]
  // A plain model (no engine) with its own flat buffer, loaded by name, strictly.
  FlatParameters<float> flat(plain);
  load_state_dict(plain, work / "model.safetensors");
  save_state_dict(plain, work / "model-bf16.safetensors", {.dtype = DType::BF16, .metadata = {{"step", "15"}}});
  // [state-dict]

  Weights loaded;
  visit_parameters(plain, [&](const std::string& name, auto& p) { loaded.emplace_back(name, p.value().to_vector()); });
  std::sort(loaded.begin(), loaded.end());
  Weights consolidated;
  const SafetensorsFile file = SafetensorsFile::open(work / "zero3-consolidated.safetensors");
  for (const auto& [name, values] : zero3_weights) consolidated.emplace_back(name, file.read<float>(name).to_vector());

  const bool resumed_exactly = same(ddp_weights, zero3_weights);
  const bool exported_exactly = same(loaded, ddp_after);
  const bool consolidated_exactly = same(consolidated, zero3_weights);
  std::printf("ZeRO-3 x4 -> DDP x1 checkpoint: %s\n", resumed_exactly ? "same weights" : "DIFFERENT weights");
  std::printf("DDP x1 -> model.safetensors -> plain model: %s\n", exported_exactly ? "same weights" : "DIFFERENT weights");
  std::printf("ZeRO-3 checkpoint -> consolidated file: %s\n", consolidated_exactly ? "same weights" : "DIFFERENT weights");
  if (!(resumed_exactly && exported_exactly && consolidated_exactly)) return 1;
  std::printf("checkpoints: every hand-over exact\n");
  return 0;
}
