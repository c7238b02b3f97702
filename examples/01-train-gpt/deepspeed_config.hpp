// polyshard-train's --deepspeed-config FILE: the library's reader (polyshard/io/deepspeed_config.hpp)
// applied to Options, the command line winning over the file as it wins over --config: a key
// whose flag was given is checked but not applied. The file's composition (stage, offload
// devices) picks --strategy, fp16 or bf16 --precision. Only main.cpp includes it (through
// command_line.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "options.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/io/deepspeed_config.hpp"

namespace train {

/// Whether a flag ("--precision") was set on the command line or in --config: those win over the
/// DeepSpeed file, as the command line wins over --config.
using FlagGiven = std::function<bool(const std::string& flag)>;

namespace detail {

/// The flag of a DeepSpeed key that sets a StrategyConfig field: its last component spelt as a
/// flag ("zero_optimization.reduce_bucket_size": --reduce-bucket-size), but for the offload
/// sections' buffer keys and gradient_accumulation_steps.
inline std::string flag_of_key(std::string_view key) {
  if (key == "zero_optimization.offload_optimizer.buffer_count") return "--optimizer-buffer-count";
  if (key == "zero_optimization.offload_param.buffer_count") return "--params-buffer-count";
  if (key == "zero_optimization.offload_param.buffer_size") return "--params-buffer-size";
  if (key == "gradient_accumulation_steps") return "--accum";
  // Stage 3's prefetch budget of 0 is --prefetch false; others are --stage3-prefetch-bucket-size.
  std::string flag = "--";
  for (const char c : key.substr(key.rfind('.') + 1)) flag += c == '_' ? '-' : c;
  return flag;
}

/// The --strategy of a DeepSpeed composition (the reader has refused those polyshard lacks).
inline std::string family_of(const polyshard::DeepSpeedConfig& c) {
  using polyshard::OffloadDevice;
  const int stage = c.stage.value_or(0);
  const OffloadDevice opt = c.offload_optimizer, param = c.offload_param;
  if (stage == 0) return "ddp";
  if (stage == 1) return opt == OffloadDevice::cpu ? "zero1_offload" : "zero1";
  if (stage == 2) return opt == OffloadDevice::cpu ? "zero_offload" : "zero2";
  if (opt == OffloadDevice::nvme) return param == OffloadDevice::nvme ? "zero_infinity_parameters" : "zero_infinity";
  if (opt == OffloadDevice::cpu) return param == OffloadDevice::cpu ? "zero3_offload" : "zero3_offload_optimizer";
  return param == OffloadDevice::cpu ? "zero3_offload_parameters" : "zero3";
}

}  // namespace detail

/// Reads the DeepSpeed JSON config `file` into `o`, leaving the flags for which `given` is true.
/// Throws polyshard::Error naming the file and the key on anything it cannot honour.
inline void apply_deepspeed_config(const std::string& file, Options& o, const FlagGiven& given) {
  // StrategyConfig's fields, with the accumulation, which polyshard-train keeps in --accum, where
  // the reader starts from and writes back.
  polyshard::StrategyConfig base = o.settings;
  base.gradient_accumulation_steps = static_cast<int>(o.accum);
  const std::string source = "polyshard-train: --deepspeed-config " + file;
  const auto c = polyshard::read_deepspeed_config(
      file, {.base = base,
             .keep = [&](std::string_view key) { return given(detail::flag_of_key(key)); },
             .source = source,
             // --strategy over the file's stage: DeepSpeed's defaults for that stage do not apply.
             .deepspeed_defaults = !given("--strategy")});
  o.settings = c.strategy;
  o.accum = c.strategy.gradient_accumulation_steps;

  // The training loop's values, each unless its flag was given.
  const auto set = [&](const std::string& flag, auto& field, const auto& value) {
    if (value && !given(flag)) field = static_cast<std::remove_reference_t<decltype(field)>>(*value);
  };
  set("--batch", o.batch, c.train_batch_size);
  if (c.train_batch_size) o.batch_given = true;
  if (c.train_micro_batch_size_per_gpu) o.micro_batch = *c.train_micro_batch_size_per_gpu;
  set("--clip", o.clip, c.gradient_clipping);
  set("--log-every", o.log_every, c.steps_per_print);
  set("--wall-clock-breakdown", o.wall_clock_breakdown, c.wall_clock_breakdown);
  for (const std::string& note : c.notes) o.notes.push_back("--deepspeed-config " + file + ": " + note);
  if (c.optimizer) {
    const polyshard::DeepSpeedOptimizer& opt = *c.optimizer;
    set("--optimizer", o.optimizer, std::optional(opt.type));
    set("--lr", o.lr, opt.lr);
    set("--eps", o.eps, opt.eps);
    set("--momentum", o.momentum, opt.momentum);
    set("--nesterov", o.nesterov, opt.nesterov);
    set("--weight-decay", o.weight_decay, opt.weight_decay);
    if (opt.betas && !given("--betas")) std::tie(o.beta1, o.beta2) = *opt.betas;
  }

  // DeepSpeed's section configures the checkpoints a model makes; here it turns them on, every
  // block recomputed in backward.
  if (c.activation_checkpointing) set("--checkpoint-activations", o.checkpoint_activations, std::optional(true));

  // The composition: the scaler of fp16-mixed is DynamicLossScale<> (consecutive_hysteresis false).
  if (c.fp16.value_or(false) && c.consecutive_hysteresis.value_or(false))
    polyshard::detail::throw_error(source, ": fp16.consecutive_hysteresis: polyshard-train cannot honour this value: "
                                   "its fp16 scaler is DynamicLossScale<> with DeepSpeed's default false (true is "
                                   "DynamicLossScale's ConsecutiveHysteresis argument, chosen at compile time)");
  if (c.fp16.value_or(false)) set("--precision", o.precision, std::optional<std::string>("fp16-mixed"));
  if (c.bf16.value_or(false)) set("--precision", o.precision, std::optional<std::string>("bf16-mixed"));
  if (c.stage || c.offload_optimizer != polyshard::OffloadDevice::none ||
      c.offload_param != polyshard::OffloadDevice::none)  // no zero_optimization: --strategy stands
    set("--strategy", o.strategy, std::optional(detail::family_of(c)));
}

}  // namespace train
