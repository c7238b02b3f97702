// polyshard-train's command line and --config file (CLI11): flags, --help and validation into
// Options. Only main.cpp includes it, so the strategy translation units never parse CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include "deepspeed_config.hpp"
#include "options.hpp"
#include "polyshard/core/error.hpp"

namespace train {

namespace detail {

/// A CLI11 check that a value reads as a T of at least `min`, its message naming the value.
/// Integers are read in decimal only and handed on in decimal (CLI11 alone would read "010" as
/// octal 8); the same check serves the command line and --config, whose values are strings too.
template <class T>
CLI::Validator number_at_least(T min = std::numeric_limits<T>::lowest()) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        T value{};
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        const char* kind = std::is_unsigned_v<T>  ? "a non-negative integer"
                           : std::is_integral_v<T> ? "an integer"
                                                   : "a number";
        if (error == std::errc::result_out_of_range) return "'" + text + "' is out of range for " + kind;
        if (error != std::errc() || stop != end) return std::string("expects ") + kind + ", got '" + text + "'";
        if (value < min) {
          std::ostringstream message;
          message << "must be at least " << min << ", got '" << text << "'";
          return message.str();
        }
        if constexpr (std::is_integral_v<T>) text = std::to_string(value);
        return "";
      },
      "");  // no description: the bound is in the option's help, not its type name
}

/// --betas B1,B2 into o.beta1 and o.beta2.
inline void parse_betas(const std::string& text, Options& o) {
  const auto comma = text.find(',');
  auto read = [&](const std::string& part, double& out) {
    const auto [stop, error] = std::from_chars(part.data(), part.data() + part.size(), out);
    return error == std::errc() && stop == part.data() + part.size();
  };
  if (comma == std::string::npos || !read(text.substr(0, comma), o.beta1) || !read(text.substr(comma + 1), o.beta2))
    throw CLI::ValidationError("--betas", "expects B1,B2, got '" + text + "'");
}

/// --help with each option group under its name as a heading ("Model:"), as the top-level
/// options are under "Options:", rather than CLI11's "[Option Group: Model]" over an "Options:".
class GroupedHelp : public CLI::Formatter {
 public:
  std::string make_expanded(const CLI::App* group) const override {
    // A group is an App of its own, with a --help of its own that the top-level one stands for.
    return make_group(group->get_group(), false,
                      group->get_options([group](const CLI::Option* flag) { return flag != group->get_help_ptr(); }));
  }
};

/// The checks that span flags or that name the allowed words: after parsing, on the values from
/// the command line and --config alike.
inline void check_combinations(const Options& o) {
  POLYSHARD_CHECK(o.data_format == "auto" || o.data_format == "text" || o.data_format == "nanogpt" ||
                      o.data_format == "llmc",
                  "polyshard-train: --data-format must be auto, text, nanogpt or llmc, got '", o.data_format, "'");
  POLYSHARD_CHECK(o.eval_every == 0 || !o.val_data.empty(), "polyshard-train: --eval-every needs --val-data FILE");
  POLYSHARD_CHECK(o.schedule == "constant" || o.schedule == "cosine",
                  "polyshard-train: --schedule must be constant or cosine, got '", o.schedule, "'");
  POLYSHARD_CHECK(o.optimizer == "sgd" || o.optimizer == "adam" || o.optimizer == "adamw",
                  "polyshard-train: --optimizer must be sgd, adam or adamw, got '", o.optimizer, "'");
  POLYSHARD_CHECK(o.backend == "threads" || o.backend == "mpi",
                  "polyshard-train: --backend must be threads, mpi or auto, got '", o.backend, "'");
  // Ranks as threads in each of a launcher's processes would make as many independent runs, each
  // writing the same metrics, traces and checkpoints.
  const int processes = launched_processes();
  POLYSHARD_CHECK(o.backend == "mpi" || processes == 1, "polyshard-train: --backend threads, and the launcher ",
                  "(mpirun, srun) started ", processes, " processes: each would train alone, as a world of its own, ",
                  "writing the same files; use --backend mpi (or leave --backend out: under a launcher it is mpi)");
  POLYSHARD_CHECK(o.backend == "threads" || !o.world_size_given || o.world_size == processes,
                  "polyshard-train: --world-size ", o.world_size, ", and under --backend mpi the world is the ",
                  processes, " process(es) the launcher started (mpirun's -np): leave --world-size out, or make it ",
                  "match");
  POLYSHARD_CHECK(o.device == "auto" || o.device == "cpu" || o.device == "cuda",
                  "polyshard-train: --device must be auto, cpu or cuda, got '", o.device, "'");
  if (!o.parallel_devices.empty()) {
    POLYSHARD_CHECK(o.device != "cpu", "polyshard-train: --parallel-devices lists GPUs, for --device cuda (or auto) "
                                       "only");
    for (std::size_t i = 0; i < o.parallel_devices.size(); ++i) {
      POLYSHARD_CHECK(o.parallel_devices[i] >= 0, "polyshard-train: --parallel-devices: GPU ", o.parallel_devices[i],
                      " is not a device index");
      for (std::size_t j = 0; j < i; ++j)
        POLYSHARD_CHECK(o.parallel_devices[j] != o.parallel_devices[i], "polyshard-train: --parallel-devices ",
                        "names GPU ", o.parallel_devices[i], " twice; each rank needs a GPU of its own");
    }
    POLYSHARD_CHECK(o.backend == "mpi" || std::ssize(o.parallel_devices) == o.world_size, "polyshard-train: ",
                    "--parallel-devices lists ", o.parallel_devices.size(), " GPU(s) for --world-size ", o.world_size,
                    "; give one per rank");
  }
  POLYSHARD_CHECK(o.precision == "fp32" || o.precision == "fp16-mixed" || o.precision == "bf16-mixed",
                  "polyshard-train: --precision must be fp32, fp16-mixed or bf16-mixed, got '", o.precision, "'");
  POLYSHARD_CHECK(o.wrap == "whole" || o.wrap == "block" || o.wrap.rfind("size:", 0) == 0,
                  "polyshard-train: --wrap must be whole, block or size:N, got '", o.wrap, "'");
  POLYSHARD_CHECK(o.save_every == 0 || !o.save.empty(), "polyshard-train: --save-every needs --save DIR");
  POLYSHARD_CHECK(o.resume.empty() || o.init.empty(),
                  "polyshard-train: --resume and --init both set the weights; give one of them");
  POLYSHARD_CHECK(o.init_hf.empty() || o.init.empty(),
                  "polyshard-train: --init-hf and --init both set the weights; give one of them");
  POLYSHARD_CHECK(o.init_hf.empty() || o.resume.empty(),
                  "polyshard-train: --init-hf and --resume both set the weights; give one of them");
  POLYSHARD_CHECK(o.batch % o.accum == 0, "polyshard-train: --batch ", o.batch, " is not divisible by --accum ",
                  o.accum);
  POLYSHARD_CHECK(o.embd % o.heads == 0, "polyshard-train: --embd ", o.embd, " is not divisible by --heads ", o.heads);
  POLYSHARD_CHECK(o.lr > 0, "polyshard-train: --lr must be positive, got ", o.lr);
  POLYSHARD_CHECK(0 <= o.beta1 && o.beta1 < 1 && 0 <= o.beta2 && o.beta2 < 1,
                  "polyshard-train: --betas must lie in [0, 1), got ", o.beta1, ",", o.beta2);
}

}  // namespace detail

/// Parses argv, and the TOML file of --config FILE where given (the command line wins over the
/// file), into `o`. Throws polyshard::Error naming the flag and the value on anything it does not
/// understand. Returns false when --help was asked for (the usage has been printed).
inline bool parse(int argc, char** argv, Options& o) {
  CLI::App app("polyshard-train: trains a GPT on a text file (byte-level tokens) or a token file, under a "
               "data-parallel strategy, and reports its progress.",
               "polyshard-train");
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  auto help = std::make_shared<detail::GroupedHelp>();
  help->column_width(34);
  app.formatter(help);
  app.set_config("--config", "", "flags from a TOML file (see below); the command line wins over it")
      ->type_name("FILE");
  app.allow_config_extras(CLI::config_extras_mode::error);  // a misspelt key is an error, not ignored
  app.footer("--config FILE: TOML, one `key = value` a line, each key a long flag without its dashes:\n"
             "  layers = 6\n"
             "  strategy = \"zero3\"\n"
             "  world-size = 3\n"
             "  nesterov = true");

  // The checks of the numeric flags: an integer of at least `min`, and any number.
  const auto at_least = [](std::int64_t min) { return detail::number_at_least<std::int64_t>(min); };
  const CLI::Validator number = detail::number_at_least<double>();

  auto* model = app.add_option_group("Model");
  model->add_option("--layers", o.layers, "transformer blocks")->type_name("N")->transform(at_least(0));
  model->add_option("--heads", o.heads, "attention heads")->type_name("N")->transform(at_least(1));
  model->add_option("--embd", o.embd, "width (a multiple of --heads)")->type_name("N")->transform(at_least(1));
  model->add_option("--seq", o.seq, "sequence length")->type_name("N")->transform(at_least(1));

  auto* training = app.add_option_group("Training");
  training->add_option("--batch", o.batch, "sequences per step, over all ranks")->type_name("N")
      ->transform(at_least(1));
  training->add_option("--steps", o.steps, "optimizer steps")->type_name("N")->transform(at_least(0));
  training->add_option("--lr", o.lr, "learning rate (positive)")->type_name("X")->transform(number);
  training->add_option("--seed", o.seed, "seed of the initial weights and the batches")->type_name("N")
      ->transform(detail::number_at_least<std::uint64_t>());
  training->add_option("--warmup", o.warmup, "steps of linear warm-up")->type_name("N")->transform(at_least(0));
  training->add_option("--schedule", o.schedule, "after the warm-up: constant, or cosine (decay to 10%)")
      ->type_name("NAME");
  training->add_option("--clip", o.clip, "clips the global gradient norm to X (0: off)")->type_name("X")
      ->transform(number);
  training->add_flag("--checkpoint-activations", o.checkpoint_activations,
                     "recompute each block's activations in the backward pass instead of keeping them");

  auto* optimizer = app.add_option_group("Optimizer");
  optimizer->add_option("--optimizer", o.optimizer, "sgd, adam or adamw")->type_name("NAME");
  optimizer
      ->add_option_function<std::string>(
          "--betas", [&o](const std::string& text) { detail::parse_betas(text, o); },
          "Adam's moment decay rates, each in [0, 1)")
      ->type_name("B1,B2")
      ->default_str("0.9,0.999");
  optimizer->add_option("--eps", o.eps, "Adam's epsilon")->type_name("X")->transform(number);
  optimizer->add_option("--weight-decay", o.weight_decay, "default: 0, or 1e-2 for adamw")->type_name("X")
      ->transform(number)
      ->default_str("");  // not -1, which stands for the optimizer's own
  optimizer->add_option("--momentum", o.momentum, "SGD's momentum")->type_name("X")->transform(number);
  optimizer->add_flag("--nesterov", o.nesterov, "SGD with Nesterov momentum");
  optimizer->add_flag("--decay-matrices-only", o.decay_matrices_only,
                      "weight decay for the matrices only: biases and norms exempt, as nanoGPT's parameter groups");

  auto* strategy = app.add_option_group("Strategy");
  strategy
      ->add_option("--strategy", o.strategy,
                   "ddp, sharded_ddp, fsdp, fsdp_grad_op, zero1, zero2, zero3, zero1_offload, zero_offload, "
                   "zero3_offload_optimizer, zero3_offload, zero3_offload_parameters, zero_infinity, "
                   "zero_infinity_parameters or hybrid; "
                   "or Lightning's deepspeed (stage 2), deepspeed_stage_1, deepspeed_stage_2, "
                   "deepspeed_stage_2_offload, deepspeed_stage_3, deepspeed_stage_3_offload, "
                   "deepspeed_stage_3_offload_nvme or ddp_sharded")
      ->type_name("NAME");
  strategy
      ->add_option("--world-size", o.world_size,
                   "ranks as threads (under --backend mpi: mpirun's -np, which it must match)")
      ->type_name("N")
      ->transform(at_least(1));
  strategy
      ->add_option("--backend", o.backend,
                   "threads (the ranks as threads of this process) or mpi (a process a rank, under mpirun); "
                   "auto: mpi when a launcher (mpirun, srun) started more than one process, else threads")
      ->type_name("NAME");
  strategy
      ->add_option("--device", o.device,
                   "cpu, or cuda (one GPU per rank, collectives over NCCL); auto, as Lightning's accelerator: "
                   "cuda where every rank has a GPU and the run does not sample, else cpu")
      ->type_name("NAME");
  strategy
      ->add_option("--parallel-devices", o.parallel_devices,
                   "--device cuda or auto: the GPU of each rank (under mpirun, of each rank of a machine), as "
                   "0,2,3; default: rank r on GPU r")
      ->delimiter(',')
      ->type_name("GPU,...");
  strategy
      ->add_option("--precision", o.precision,
                   "fp32, fp16-mixed or bf16-mixed; fp16-mixed scales the loss as the strategy's reference: "
                   "PyTorch's GradScaler under ddp, sharded_ddp, ddp_sharded, fsdp, fsdp_grad_op and hybrid, "
                   "DeepSpeed's scaler under the others")
      ->type_name("NAME");
  strategy
      ->add_option("--wrap", o.wrap,
                   "FSDP's units: whole (the model), block (each block) or size:N (modules of N parameters)")
      ->type_name("NAME");
  strategy
      ->add_option("--accum,--gradient-accumulation-steps", o.accum,
                   "micro-batches per step, counted by the engine (StrategyConfig::gradient_accumulation_steps)")
      ->type_name("K")
      ->transform(at_least(1));
  strategy->add_option("--hybrid-group", o.hybrid_group, "hybrid: ranks per sharding group (default: half the world)")
      ->type_name("N")
      ->transform(at_least(1))
      ->default_str("");
  strategy
      ->add_option("--nvme-path", o.settings.nvme_path,
                   "zero_infinity: directory on a local NVMe drive for the optimizer state (and, under "
                   "zero_infinity_parameters, the parameter shards)")
      ->type_name("DIR");
  strategy
      ->add_option("--remote-device", o.settings.remote_device,
                   "cpu or nvme: where the parameters are first built (Lightning's remote_device); accepted where "
                   "the strategy builds its shards (cpu on the host or with parameters offloaded there, nvme under "
                   "zero_infinity_parameters), refused elsewhere")
      ->type_name("NAME");

  // StrategyConfig's fields under their reference names; the engine refuses, naming the field, a
  // value its strategy does not read (docs/options.md).
  auto* settings =
      app.add_option_group("Strategy settings (StrategyConfig; refused where the strategy does not read them)");
  polyshard::StrategyConfig& c = o.settings;
  // The three gradient-bucket caps: where none is given, the strategy's reference's
  // (fill_named_defaults); given ones replace it, the smallest cutting.
  settings
      ->add_option_function<double>(
          "--bucket-cap-mb", [&c](double mb) { c.bucket_cap_mb = mb; },
          "MiB of gradients a reduction carries, <= 0: no cap (PyTorch DDP, FSDP; default 25 under their names)")
      ->type_name("X")->transform(number);
  settings
      ->add_option_function<std::int64_t>(
          "--reduce-bucket-size", [&c](std::int64_t n) { c.reduce_bucket_size = n; },
          "elements reduced at once (DeepSpeed; default 200000000 under the zero and deepspeed names)")
      ->type_name("N")->transform(at_least(1));
  settings
      ->add_option_function<std::int64_t>(
          "--reduce-buffer-size", [&c](std::int64_t n) { c.reduce_buffer_size = n; },
          "elements batching small parameters' gradients, 0: each alone (FairScale; default: sharded_ddp 8388608, "
          "ddp_sharded 0 on one machine and 8388608 across)")
      ->type_name("N")->transform(detail::number_at_least<std::int64_t>(0));
  settings->add_option("--allgather-bucket-size", c.allgather_bucket_size,
                       "zero1, zero2: elements of each all-gather of the updated shards (DeepSpeed)")
      ->type_name("N")->transform(at_least(1));
  settings
      ->add_option_function<std::int64_t>(
          "--stage3-prefetch-bucket-size", [&c](std::int64_t n) { c.stage3_prefetch_bucket_size = n; },
          "sharded parameters: elements of units gathered ahead (DeepSpeed; default: the next unit only)")
      ->type_name("N")->transform(at_least(1));
  settings
      ->add_option_function<std::string>(
          "--partition",
          [&c](const std::string& p) {
            c.partition = p == "whole_parameters" ? polyshard::ShardPartition::whole_parameters
                                                  : polyshard::ShardPartition::flat_slices;
          },
          "zero1, zero2: flat_slices (even slices of each unit) or whole_parameters (each parameter on one rank, "
          "FairScale's OSS; default under sharded_ddp and ddp_sharded)")
      ->type_name("NAME")->check(CLI::IsMember({"flat_slices", "whole_parameters"}));
  settings->add_option("--overlap-comm", c.overlap_comm, "overlap reductions with backward")->type_name("BOOL");
  settings->add_option("--prefetch", c.prefetch, "sharded parameters: gather the next units ahead")->type_name("BOOL");
  settings->add_option("--delayed-parameter-update", c.delayed_parameter_update,
                       "optimizer offloaded to the host: step beside the next forward and backward (ZeRO-Offload's DPU)")
      ->type_name("BOOL");
  settings->add_option("--sync-models-at-startup", c.sync_models_at_startup, "broadcast rank 0's weights first")
      ->type_name("BOOL");
  settings->add_option("--broadcast-buffers", c.broadcast_buffers, "broadcast module buffers before each forward")
      ->type_name("BOOL");
  settings->add_option("--auto-refresh-trainable", c.auto_refresh_trainable,
                       "re-read requires_grad flags that changed, instead of refusing (FairScale)")->type_name("BOOL");
  settings->add_option("--warn-on-trainable-params-changed", c.warn_on_trainable_params_changed,
                       "warn when auto_refresh_trainable re-reads them")->type_name("BOOL");
  settings->add_option("--pin-memory", c.pin_memory, "page-locked host buffers for offload")->type_name("BOOL");
  settings->add_option("--block-size", c.block_size, "NVMe: bytes a read or write carries")->type_name("N")
      ->transform(at_least(1));
  settings->add_option("--queue-depth", c.queue_depth, "NVMe: requests in flight")->type_name("N")
      ->transform(detail::number_at_least<int>(1));
  settings
      ->add_option("--optimizer-buffer-count", c.optimizer_buffer_count,
                   "NVMe: optimizer-state buffers (a sub-group takes 4 for Adam)")
      ->type_name("N")->transform(detail::number_at_least<int>(1));
  settings->add_option("--params-buffer-count", c.params_buffer_count, "NVMe parameters: buffers")->type_name("N")
      ->transform(detail::number_at_least<int>(1));
  settings->add_option("--params-buffer-size", c.params_buffer_size, "NVMe parameters: elements a buffer holds")
      ->type_name("N")->transform(at_least(1));
  settings->add_option("--max-in-cpu", c.max_in_cpu, "NVMe parameters: elements kept in host memory instead")
      ->type_name("N");
  settings->add_option("--sub-group-size", c.sub_group_size, "elements the optimizer steps at once")->type_name("N")
      ->transform(at_least(1));
  settings
      ->add_option("--state-dict-to-cpu", c.state_dict_to_cpu,
                   "full state dicts (--export, --export-hf) gathered in host memory, or else on the device")
      ->type_name("BOOL");
  settings
      ->add_option("--cpu-checkpointing", c.cpu_checkpointing,
                   "device models: each checkpointed block's input waits in host memory until backward")
      ->type_name("BOOL");
  settings
      ->add_option("--contiguous-memory-optimization", c.contiguous_memory_optimization,
                   "with --cpu-checkpointing: those inputs in one page-locked buffer")
      ->type_name("BOOL");
  settings->add_option("--number-checkpoints", c.number_checkpoints,
                       "with --contiguous-memory-optimization: the buffer holds this many inputs of the first's "
                       "size, from the first step (default: sized by the step before)");
  settings
      ->add_option("--synchronize-checkpoint-boundary", c.synchronize_checkpoint_boundary,
                   "device models: synchronize the device at each checkpoint boundary")
      ->type_name("BOOL");
  settings
      ->add_option_function<std::string>(
          "--move-grads-to-cpu", [&c](const std::string& v) { c.move_grads_to_cpu = v == "true"; },
          "reduced gradient shards to host memory (FSDP; default: where the optimizer steps)")
      ->check(CLI::IsMember({"true", "false"}))
      ->type_name("BOOL");
  settings
      ->add_option("--deepspeed-config", o.deepspeed_config,
                   "a DeepSpeed JSON config: its keys set the flags not given on the command line or in --config")
      ->type_name("FILE.json");

  auto* scaling =
      app.add_option_group("Loss scaling (fp16-mixed; DeepSpeed's keys, refused where the scaler has no use for them)");
  scaling->add_option("--loss-scale", c.loss_scale, "0: dynamic; a positive value: that static scale")
      ->type_name("X")
      ->transform(detail::number_at_least<double>(0));
  // Unset unless given (here, in --config or in --deepspeed-config): the precision policy's own.
  scaling
      ->add_option_function<int>(
          "--initial-scale-power", [&c](int n) { c.initial_scale_power = n; },
          "the dynamic scale starts at 2^N (default 16)")
      ->type_name("N")
      ->transform(detail::number_at_least<int>(0));
  scaling
      ->add_option_function<int>(
          "--loss-scale-window", [&c](int n) { c.loss_scale_window = n; },
          "steps without overflow before the scale doubles (default 1000; GradScaler's growth_interval: 2000)")
      ->type_name("N")
      ->transform(detail::number_at_least<int>(1));
  scaling
      ->add_option_function<int>(
          "--hysteresis", [&c](int n) { c.hysteresis = n; },
          "overflows that skip their step before the scale halves (default 2; DeepSpeed's scaler only)")
      ->type_name("N")
      ->transform(detail::number_at_least<int>(1));
  scaling
      ->add_option_function<double>(
          "--min-loss-scale", [&c](double x) { c.min_loss_scale = x; },
          "the scale never halves below X (default 1; DeepSpeed's scaler only)")
      ->type_name("X")
      ->transform(detail::number_at_least<double>(0));

  auto* data = app.add_option_group("Data");
  data->add_option("--data", o.data, "text (byte tokens) or a token file of uint16 ids (default: the built-in corpus)")
      ->type_name("FILE");
  data->add_option("--data-format", o.data_format,
                   "auto (llm.c's header, else nanoGPT's for a .bin name, else text), text, nanogpt or llmc")
      ->type_name("NAME");
  data->add_option("--vocab", o.vocab, "default: 256 for text, 50257 for token files; every token must lie below it")
      ->type_name("N")
      ->transform(at_least(1))
      ->default_str("");
  data->add_option("--val-data", o.val_data, "a validation set")->type_name("FILE");
  data->add_option("--eval-every", o.eval_every, "steps between validation losses (default: at the end only)")
      ->type_name("K")
      ->transform(at_least(1))
      ->default_str("");
  data->add_option("--eval-batches", o.eval_batches, "batches each validation loss averages")->type_name("M")
      ->transform(at_least(1));

  auto* output = app.add_option_group("Output");
  output->add_option("--metrics", o.metrics, "JSON lines, one per step")->type_name("FILE.jsonl");
  output->add_option("--trace", o.trace, "Chrome trace of compute and communication per rank")->type_name("FILE.json");
  output->add_option("--log-every", o.log_every, "steps between printed losses")->type_name("N")
      ->transform(at_least(1));
  output->add_flag("--wall-clock-breakdown", o.wall_clock_breakdown,
                   "with each printed loss, the mean time of forward, backward and the optimizer step since the "
                   "last (timed apart, the device synchronized at each; DeepSpeed's wall_clock_breakdown)");
  output->add_option("--threads", o.threads, "BLAS threads (0: every core, shared by the ranks)")->type_name("N")
      ->transform(detail::number_at_least<int>(0));

  auto* checkpoints = app.add_option_group("Checkpoints");
  checkpoints->add_option("--save", o.save, "sharded checkpoint written at the end")->type_name("DIR");
  checkpoints->add_option("--save-every", o.save_every, "also every K steps (needs --save)")->type_name("K")
      ->transform(at_least(1))
      ->default_str("");
  checkpoints->add_option("--resume", o.resume, "continue a run from its checkpoint, on any strategy and world size")
      ->type_name("DIR");
  checkpoints->add_option("--init", o.init, "start from full weights (PyTorch names)")->type_name("FILE.safetensors");
  checkpoints->add_option("--export", o.export_weights, "full weights written at the end")
      ->type_name("FILE.safetensors");
  checkpoints
      ->add_option("--init-hf", o.init_hf,
                   "start from a Hugging Face save_pretrained directory (its config.json sets the sizes)")
      ->type_name("DIR");
  checkpoints
      ->add_option("--export-hf", o.export_hf,
                   "a save_pretrained directory written at the end (GPT2LMHeadModel.from_pretrained loads it)")
      ->type_name("DIR");

  auto* sampling = app.add_option_group("Sampling");
  sampling->add_option("--sample-every", o.sample_every, "steps between printed samples (default: none)")
      ->type_name("K")
      ->transform(at_least(1))
      ->default_str("");
  sampling->add_option("--sample-tokens", o.sample_tokens, "tokens each sample generates")->type_name("N")
      ->transform(at_least(1));
  sampling->add_option("--temperature", o.temperature, "0: greedy (the most likely token)")->type_name("T")
      ->transform(detail::number_at_least<double>(0));
  sampling->add_option("--top-k", o.top_k, "sample among the K most likely tokens (0: all)")->type_name("K")
      ->transform(at_least(0));
  sampling
      ->add_option("--prompt", o.prompt,
                   "text for byte tokens, or token ids \"1,2,3\" for token files (default: the first token of --data)")
      ->type_name("TEXT");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    app.exit(help);  // prints the usage to stdout
    return false;
  } catch (const CLI::FileError& e) {
    polyshard::detail::throw_error("polyshard-train: --config: ", e.what());
  } catch (const CLI::ConfigError& e) {  // a key that is no flag, or one that a file cannot set (config)
    std::string message = e.what();
    const std::string unknown = "INI was not able to parse ";  // CLI11's words, then the key
    if (message.rfind(unknown, 0) == 0) message = "no flag is called '" + message.substr(unknown.size()) + "'";
    polyshard::detail::throw_error("polyshard-train: --config ", app.get_config_ptr()->as<std::string>(), ": ",
                                   message, " (see --help)");
  } catch (const CLI::ParseError& e) {
    // A bad value is reported under its flag ("--layers: ..."), wherever it came from: a flag
    // set but not on the command line was set in the --config file, which the message then names.
    const std::string message = e.what();
    const std::string flag = message.substr(0, message.find(':'));
    const bool on_command_line = std::any_of(argv + 1, argv + argc, [&](const char* arg) {
      const std::string given = arg;
      return given == flag || given.rfind(flag + "=", 0) == 0;
    });
    if (app.get_config_ptr()->count() > 0 && flag.rfind("--", 0) == 0 && !on_command_line)
      polyshard::detail::throw_error("polyshard-train: --config ", app.get_config_ptr()->as<std::string>(), ": ",
                                     message);
    polyshard::detail::throw_error("polyshard-train: ", message, " (see --help)");
  }
  o.batch_given = app.get_option("--batch")->count() > 0;
  o.world_size_given = app.get_option("--world-size")->count() > 0;
  if (o.backend == "auto") o.backend = launched_processes() > 1 ? "mpi" : "threads";
  if (!o.deepspeed_config.empty())
    apply_deepspeed_config(o.deepspeed_config, o,
                           [&app](const std::string& flag) { return app.get_option(flag)->count() > 0; });
  detail::check_combinations(o);
  return true;
}

}  // namespace train
