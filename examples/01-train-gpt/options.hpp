// polyshard-train's options and what follows from them (FSDP's wrap threshold, the learning rate
// schedule). Light on purpose: every strategy translation unit includes it; the command line is
// parsed in command_line.hpp, which main.cpp alone includes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "launcher.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/policy/config.hpp"

namespace train {

struct Options {
  // Model.
  std::int64_t layers = 4, heads = 4, embd = 128, seq = 64;
  std::int64_t positions = 0;  // the model's positions (block size); 0: seq. --init-hf's config.json sets it
  // Training.
  std::int64_t batch = 16, steps = 200;
  std::uint64_t seed = 1337;
  double lr = 1e-3;
  std::int64_t warmup = 0;
  std::string schedule = "constant";  // constant | cosine
  double clip = 0.0;                  // 0: no clipping
  bool checkpoint_activations = false;
  // Optimizer.
  std::string optimizer = "adamw";  // sgd | adam | adamw
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = -1;  // -1: the optimizer's default (0, or 1e-2 for AdamW)
  double momentum = 0.0;
  bool nesterov = false;
  bool decay_matrices_only = false;  // biases and norms exempt from weight decay (nanoGPT's groups)
  // Strategy.
  std::string strategy = "ddp";     // see strategy_names
  std::int64_t world_size = 1;      // ranks as threads (under --backend mpi, mpirun's processes)
  std::string backend = "auto";     // threads | mpi | auto: mpi under mpirun's processes, else threads (parse())
  bool world_size_given = false;    // --world-size was given (on the command line or in --config)
  std::string device = "auto";      // auto | cpu | cuda (one GPU per rank, NCCL)
  std::vector<int> parallel_devices;  // each rank's GPU (by local rank under mpirun); empty: rank r on GPU r
  std::string precision = "fp32";   // fp32 | fp16-mixed | bf16-mixed
  std::string wrap = "block";       // whole | block | size:N
  std::int64_t accum = 1;           // micro-batches per step (gradient accumulation with no_sync)
  std::int64_t hybrid_group = 0;    // --strategy hybrid: ranks per sharding group (0: half the world)
  // StrategyConfig's fields, each under its own flag (--nvme-path, --reduce-bucket-size, the loss
  // scaling's --hysteresis, ...), except those other options decide (min_num_params from --wrap,
  // hybrid_group_size from --hybrid-group, gradient_accumulation_steps from --accum), which the
  // trainer writes over these. The engine refuses a setting its strategy does not read.
  polyshard::StrategyConfig settings;
  std::int64_t micro_batch = 0;  // DeepSpeed's train_micro_batch_size_per_gpu; 0: --batch decides
  bool batch_given = false;      // --batch, or train_batch_size, was given
  std::string deepspeed_config;  // --deepspeed-config FILE (applied in command_line.hpp)
  // Input and output.
  std::string data;     // empty: the built-in corpus
  std::string data_format = "auto";  // auto (from the file's header and name) | text | nanogpt | llmc
  std::int64_t vocab = 0;            // 0: 256 for text (bytes), 50257 for token files (GPT-2's)
  std::string val_data;              // validation set, in --data's format (or its own, detected)
  std::int64_t eval_every = 0;       // steps between validation losses (0: at the end only)
  std::int64_t eval_batches = 4;     // batches each validation loss averages, the same ones every time
  std::string metrics;  // JSON lines, one per step
  std::string trace;    // Chrome trace of compute and communication per rank
  std::int64_t log_every = 1;
  bool wall_clock_breakdown = false;  // DeepSpeed's: forward, backward and step timed apart at each print
  std::vector<std::string> notes;     // printed at the start: --deepspeed-config's keys without a setting here
  int threads = 0;  // 0: every core
  // Checkpoints and weights.
  std::string save;             // sharded checkpoint directory written at the end (and every save_every steps)
  std::int64_t save_every = 0;  // 0: only at the end
  std::string resume;           // sharded checkpoint directory to continue from
  std::string init;             // full weights (safetensors, PyTorch names) to start from
  std::string export_weights;   // full weights written at the end
  std::string init_hf;          // a save_pretrained directory (config.json sets the sizes) to start from
  std::string export_hf;        // a save_pretrained directory written at the end (GPT2LMHeadModel loads it)
  // Sampling.
  std::int64_t sample_every = 0;   // steps between samples (0: none)
  std::int64_t sample_tokens = 32; // tokens each sample generates
  double temperature = 1.0;        // 0: greedy (the most likely token)
  std::int64_t top_k = 0;          // 0: every token
  std::string prompt;              // text (byte tokens) or token ids "1,2,3"; empty: the first token of --data
};

namespace detail {
/// The number of type T that `text` spells, or an error naming `flag` and the text.
template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  std::istringstream in(text);
  T value{};
  in >> value;
  POLYSHARD_CHECK(!in.fail() && in.eof(), "polyshard-train: ", flag, " expects a number, got '", text, "'");
  return value;
}
}  // namespace detail

/// FSDP's min_num_params for --wrap: whole wraps nothing (a threshold no module reaches),
/// size:N wraps modules of at least N parameters; block's depends on the model
/// (block_wrap_threshold in trainer.hpp).
inline std::int64_t wrap_threshold(const Options& o) {
  if (o.wrap == "whole") return std::numeric_limits<std::int64_t>::max();
  if (o.wrap.rfind("size:", 0) == 0) {
    const auto n = detail::parse_number<std::int64_t>("--wrap size:N", o.wrap.substr(5));
    POLYSHARD_CHECK(n >= 1, "polyshard-train: --wrap size:N needs N >= 1, got ", n);
    return n;
  }
  return 0;
}

/// DeepSpeed's rule, train_batch_size = micro batch x accumulation steps x world size, once the
/// world is known: a micro batch (--deepspeed-config's train_micro_batch_size_per_gpu) sets
/// --batch, or must agree with it where both were given. Then every rank must get a row of each
/// micro-batch.
inline void resolve_micro_batch(Options& o, int world) {
  if (o.micro_batch != 0) {
    const std::int64_t batch = o.micro_batch * o.accum * world;
    POLYSHARD_CHECK(!o.batch_given || o.batch == batch, "polyshard-train: --deepspeed-config ", o.deepspeed_config,
                    ": train_micro_batch_size_per_gpu ", o.micro_batch,
                    " x gradient accumulation ", o.accum, " x ", world, " rank(s) is ", batch, ", not the batch ",
                    o.batch, " given (train_batch_size or --batch)");
    o.batch = batch;
  }
  // A rank without rows would have no loss to take the gradient of.
  POLYSHARD_CHECK(o.batch / o.accum >= world, "polyshard-train: --batch ", o.batch, " in ", o.accum,
                  " micro-batch(es) is ", o.batch / o.accum, " row(s) a micro-batch for ", world,
                  " rank(s): each rank needs at least one; raise --batch or use fewer ranks");
}

/// The GPU of the rank that is `local_rank` on its machine (its rank, with ranks as threads):
/// its entry of --parallel-devices (Lightning's parallel_devices), else GPU `local_rank`.
inline int rank_device(const Options& o, int local_rank) {
  if (o.parallel_devices.empty()) return local_rank;
  POLYSHARD_CHECK(static_cast<std::size_t>(local_rank) < o.parallel_devices.size(), "polyshard-train: ",
                  "--parallel-devices lists ", o.parallel_devices.size(), " GPU(s), none for the rank ", local_rank,
                  " of this machine");
  return o.parallel_devices[static_cast<std::size_t>(local_rank)];
}

/// The model's positions (its block size): --init-hf's n_positions, else --seq.
inline std::int64_t model_positions(const Options& o) { return o.positions > 0 ? o.positions : o.seq; }

/// Learning rate at 0-based `step`: linear warm-up, then constant or cosine decay to 10%.
inline double learning_rate(const Options& o, std::int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  if (o.schedule == "constant") return o.lr;
  const double span = static_cast<double>(std::max<std::int64_t>(o.steps - o.warmup, 1));
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup) / span);
  constexpr double pi = 3.14159265358979323846;
  return o.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(pi * progress)));
}

}  // namespace train
