// Command-line options of polyshard-train: parsing, validation and --help.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "polyshard/core/error.hpp"

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
  // Strategy.
  std::string strategy = "ddp";     // see strategy_names
  std::int64_t world_size = 1;      // ranks as threads (ignored under mpirun: the MPI world)
  std::string backend = "threads";  // threads | mpi
  std::string device = "cpu";       // cpu | cuda (one GPU per rank, NCCL)
  std::string precision = "fp32";   // fp32 | fp16-mixed | bf16-mixed
  std::string wrap = "block";       // whole | block | size:N
  std::int64_t accum = 1;           // micro-batches per step (gradient accumulation with no_sync)
  std::int64_t hybrid_group = 0;    // --strategy hybrid: ranks per sharding group (0: half the world)
  std::string nvme_path = "/local_nvme";  // --strategy zero_infinity: directory of the optimizer-state files
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

inline const char* usage =
    R"(polyshard-train: trains a GPT on a text file (byte-level tokens) and reports its progress.

Model:      --layers N (4)  --heads N (4)  --embd N (128)  --seq N (64)
Training:   --batch N (16, global)  --steps N (200)  --lr X (1e-3)  --seed N (1337)
            --warmup N (0 steps of linear warm-up)  --schedule constant|cosine (constant)
            --clip X (0: off; clips the global gradient norm)  --checkpoint-activations
Optimizer:  --optimizer sgd|adam|adamw (adamw)  --betas B1,B2 (0.9,0.999)  --eps X (1e-8)
            --weight-decay X (0; 1e-2 for adamw)  --momentum X (0)  --nesterov
Strategy:   --strategy ddp|sharded_ddp|fsdp|fsdp_grad_op|zero1|zero2|zero3|zero_offload|zero3_offload|zero_infinity|hybrid (ddp)
            --world-size N (1; ranks as threads)  --backend threads|mpi (threads; mpi under mpirun)
            --device cpu|cuda (cpu; cuda: one GPU per rank, collectives over NCCL)
            --precision fp32|fp16-mixed|bf16-mixed (fp32)  --wrap whole|block|size:N (block)
            --accum K (1 micro-batch per step)  --hybrid-group N (hybrid: ranks per group; half the world)
            --nvme-path DIR (zero_infinity: directory on a local NVMe drive for the optimizer state; /local_nvme)
Data:       --data FILE (default: the built-in corpus): text (byte tokens) or a token file of uint16 ids
            --data-format auto|text|nanogpt|llmc (auto: llm.c's header, else nanoGPT's for a .bin name, else text)
            --vocab N (256 for text, 50257 for token files; every token is checked against it)
            --val-data FILE (a validation set)  --eval-every K (0: at the end only)  --eval-batches M (4)
Output:     --metrics FILE.jsonl  --trace FILE.json (Chrome trace per rank)  --log-every N (1)
            --threads N (0: every core)
Checkpoints: --save DIR (sharded checkpoint at the end)  --save-every K (also every K steps)
            --resume DIR (continue a run from its checkpoint, on any strategy and world size)
            --init FILE.safetensors (start from full weights)  --export FILE.safetensors (full weights at the end)
)";

namespace detail {
template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  std::istringstream in(text);
  T value{};
  in >> value;
  POLYSHARD_CHECK(!in.fail() && in.eof(), "polyshard-train: ", flag, " expects a number, got '", text, "'");
  return value;
}
}  // namespace detail

/// Parses argv; throws polyshard::Error naming the flag on anything it does not understand.
/// Returns false when --help was asked for (the usage has been printed).
inline bool parse(int argc, char** argv, Options& o) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> const std::string& {
      POLYSHARD_CHECK(i + 1 < args.size(), "polyshard-train: ", flag, " needs a value");
      return args[++i];
    };
    auto integer = [&](std::int64_t& out, std::int64_t min) {
      out = detail::parse_number<std::int64_t>(flag, value());
      POLYSHARD_CHECK(out >= min, "polyshard-train: ", flag, " must be at least ", min, ", got ", out);
    };
    auto real = [&](double& out) { out = detail::parse_number<double>(flag, value()); };
    if (flag == "--help" || flag == "-h") {
      std::cout << usage;
      return false;
    } else if (flag == "--layers") integer(o.layers, 0);
    else if (flag == "--heads") integer(o.heads, 1);
    else if (flag == "--embd") integer(o.embd, 1);
    else if (flag == "--seq") integer(o.seq, 1);
    else if (flag == "--batch") integer(o.batch, 1);
    else if (flag == "--steps") integer(o.steps, 0);
    else if (flag == "--warmup") integer(o.warmup, 0);
    else if (flag == "--log-every") integer(o.log_every, 1);
    else if (flag == "--seed") o.seed = detail::parse_number<std::uint64_t>(flag, value());
    else if (flag == "--threads") { std::int64_t t; integer(t, 0); o.threads = static_cast<int>(t); }
    else if (flag == "--lr") real(o.lr);
    else if (flag == "--clip") real(o.clip);
    else if (flag == "--eps") real(o.eps);
    else if (flag == "--weight-decay") real(o.weight_decay);
    else if (flag == "--momentum") real(o.momentum);
    else if (flag == "--nesterov") o.nesterov = true;
    else if (flag == "--checkpoint-activations") o.checkpoint_activations = true;
    else if (flag == "--schedule") o.schedule = value();
    else if (flag == "--optimizer") o.optimizer = value();
    else if (flag == "--data") o.data = value();
    else if (flag == "--data-format") o.data_format = value();
    else if (flag == "--vocab") integer(o.vocab, 1);
    else if (flag == "--val-data") o.val_data = value();
    else if (flag == "--eval-every") integer(o.eval_every, 1);
    else if (flag == "--eval-batches") integer(o.eval_batches, 1);
    else if (flag == "--strategy") o.strategy = value();
    else if (flag == "--world-size") integer(o.world_size, 1);
    else if (flag == "--backend") o.backend = value();
    else if (flag == "--device") o.device = value();
    else if (flag == "--precision") o.precision = value();
    else if (flag == "--wrap") o.wrap = value();
    else if (flag == "--accum") integer(o.accum, 1);
    else if (flag == "--hybrid-group") integer(o.hybrid_group, 1);
    else if (flag == "--nvme-path") o.nvme_path = value();
    else if (flag == "--metrics") o.metrics = value();
    else if (flag == "--trace") o.trace = value();
    else if (flag == "--save") o.save = value();
    else if (flag == "--save-every") integer(o.save_every, 1);
    else if (flag == "--resume") o.resume = value();
    else if (flag == "--init") o.init = value();
    else if (flag == "--export") o.export_weights = value();
    else if (flag == "--betas") {
      const std::string v = value();
      const auto comma = v.find(',');
      POLYSHARD_CHECK(comma != std::string::npos, "polyshard-train: --betas expects B1,B2, got '", v, "'");
      o.beta1 = detail::parse_number<double>(flag, v.substr(0, comma));
      o.beta2 = detail::parse_number<double>(flag, v.substr(comma + 1));
    } else {
      polyshard::detail::throw_error("polyshard-train: unknown option '", flag, "' (see --help)");
    }
  }
  POLYSHARD_CHECK(o.data_format == "auto" || o.data_format == "text" || o.data_format == "nanogpt" ||
                      o.data_format == "llmc",
                  "polyshard-train: --data-format must be auto, text, nanogpt or llmc, got '", o.data_format, "'");
  POLYSHARD_CHECK(o.eval_every == 0 || !o.val_data.empty(), "polyshard-train: --eval-every needs --val-data FILE");
  POLYSHARD_CHECK(o.schedule == "constant" || o.schedule == "cosine",
                  "polyshard-train: --schedule must be constant or cosine, got '", o.schedule, "'");
  POLYSHARD_CHECK(o.optimizer == "sgd" || o.optimizer == "adam" || o.optimizer == "adamw",
                  "polyshard-train: --optimizer must be sgd, adam or adamw, got '", o.optimizer, "'");
  POLYSHARD_CHECK(o.backend == "threads" || o.backend == "mpi",
                  "polyshard-train: --backend must be threads or mpi, got '", o.backend, "'");
  POLYSHARD_CHECK(o.device == "cpu" || o.device == "cuda",
                  "polyshard-train: --device must be cpu or cuda, got '", o.device, "'");
  POLYSHARD_CHECK(o.precision == "fp32" || o.precision == "fp16-mixed" || o.precision == "bf16-mixed",
                  "polyshard-train: --precision must be fp32, fp16-mixed or bf16-mixed, got '", o.precision, "'");
  POLYSHARD_CHECK(o.wrap == "whole" || o.wrap == "block" || o.wrap.rfind("size:", 0) == 0,
                  "polyshard-train: --wrap must be whole, block or size:N, got '", o.wrap, "'");
  POLYSHARD_CHECK(o.save_every == 0 || !o.save.empty(), "polyshard-train: --save-every needs --save DIR");
  POLYSHARD_CHECK(o.resume.empty() || o.init.empty(),
                  "polyshard-train: --resume and --init both set the weights; give one of them");
  POLYSHARD_CHECK(o.batch % o.accum == 0, "polyshard-train: --batch ", o.batch, " is not divisible by --accum ",
                  o.accum);
  POLYSHARD_CHECK(o.embd % o.heads == 0, "polyshard-train: --embd ", o.embd, " is not divisible by --heads ", o.heads);
  POLYSHARD_CHECK(o.lr > 0, "polyshard-train: --lr must be positive, got ", o.lr);
  POLYSHARD_CHECK(0 <= o.beta1 && o.beta1 < 1 && 0 <= o.beta2 && o.beta2 < 1,
                  "polyshard-train: --betas must lie in [0, 1), got ", o.beta1, ",", o.beta2);
  return true;
}

/// FSDP's min_num_params for --wrap: whole wraps nothing (a threshold no module reaches),
/// size:N wraps modules of at least N parameters; block uses the type-based policy instead.
inline std::int64_t wrap_threshold(const Options& o) {
  if (o.wrap == "whole") return std::numeric_limits<std::int64_t>::max();
  if (o.wrap.rfind("size:", 0) == 0) {
    const auto n = detail::parse_number<std::int64_t>("--wrap size:N", o.wrap.substr(5));
    POLYSHARD_CHECK(n >= 1, "polyshard-train: --wrap size:N needs N >= 1, got ", n);
    return n;
  }
  return 0;
}

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
