// The strategies polyshard-train names: a sharding family (--strategy) and a precision
// (--precision); the wrap (--wrap) is a run-time setting of each. Their engines are compiled one
// translation unit per precision and device (strategies.cpp, built once for each), so that no
// translation unit holds every composition and
// the dispatch below instantiates none. Grouping by precision, not by family, is what keeps the
// total down: on a device the precision fixes the model's element type, and every code that
// depends on the model but not on the strategy (the model itself, the unit plan, checkpoint and
// weight files) is then compiled once per unit instead of once per family.
#pragma once

#include <string>

#include "options.hpp"
#include "polyshard/core/device.hpp"
#include "polyshard/policy/defaults.hpp"
#include "datasets.hpp"
#include "polyshard/profile/trace.hpp"

namespace train {

/// One sharding and offload pair of --strategy; the precision makes three strategies of each.
enum class Family {
  ddp,
  zero1,
  zero2,
  zero3,
  fsdp_grad_op,
  zero1_offload,
  zero_offload,
  zero3_offload_optimizer,
  zero3_offload,
  zero3_offload_parameters,
  hybrid,
  zero_infinity,
  zero_infinity_parameters
};

/// --precision: fp32, bf16-mixed, fp16-mixed. fp16-mixed scales the loss as the strategy's
/// reference does (Lightning's precision=16): DeepSpeed's dynamic scaler under the ZeRO and
/// DeepSpeed names (fp16_mixed: Fp16Mixed), PyTorch's GradScaler under DDP, FairScale's
/// ShardedDDP and FSDP, and the hybrid shard (fp16_amp: Fp16Amp).
enum class Precision { fp32, bf16_mixed, fp16_mixed, fp16_amp };

/// Whether --strategy names a strategy whose reference scales fp16 losses with PyTorch's
/// GradScaler (Lightning's ddp, ddp_sharded and fsdp: its native AMP plugins, FairScale's
/// ShardedGradScaler) rather than DeepSpeed's scaler.
inline bool scales_as_grad_scaler(const std::string& strategy) {
  return strategy == "ddp" || strategy == "sharded_ddp" || strategy == "ddp_sharded" || strategy == "fsdp" ||
         strategy == "fsdp_grad_op" || strategy == "hybrid";
}

/// The settings of --strategy's reference that the command line leaves unset (the families'
/// types share one engine whatever their reference, so the name, not the type, says whose
/// defaults policy applies): FairScaleShardedDefaults under sharded_ddp and ddp_sharded
/// (FairScale's OSS: each parameter whole on one rank), TorchDefaults under the other PyTorch and
/// FairScale names, DeepSpeedDefaults under the ZeRO and DeepSpeed names. The gradient-bucket cap,
/// where none of --bucket-cap-mb, --reduce-bucket-size and --reduce-buffer-size is given, is the
/// policy's, but under ddp_sharded what Lightning's DDPShardedStrategy passes as
/// reduce_buffer_size (FairScale's default when the ranks span machines, else 0: every parameter
/// reduced alone). The partition, where --partition is not given, is the policy's where the
/// family shards the optimizer state of whole parameters (polyshard::fill_reference_defaults).
template <class S>
void fill_named_defaults(polyshard::StrategyConfig& c, const std::string& strategy, bool ranks_span_machines) {
  using Sharding = typename S::sharding;
  if (strategy == "ddp_sharded" && !polyshard::sets_bucket_cap(c))  // Lightning's choice, set before the policy's
    c.reduce_buffer_size = ranks_span_machines ? polyshard::fairscale_reduce_buffer_size : 0;
  if (strategy == "ddp_sharded" || strategy == "sharded_ddp")
    polyshard::fill_reference_defaults<Sharding, polyshard::FairScaleShardedDefaults>(c);
  else if (scales_as_grad_scaler(strategy)) polyshard::fill_reference_defaults<Sharding, polyshard::TorchDefaults>(c);
  else polyshard::fill_reference_defaults<Sharding, polyshard::DeepSpeedDefaults>(c);
}

/// Trains one rank under the strategy of family F and precision P with the options' wrap,
/// computing on device D with communicator Comm. Defined in trainer.hpp and instantiated in
/// strategies.cpp, one translation unit per precision and device.
template <Family F, Precision P, class D, class Comm>
void train_strategy(const Options& o, Comm& comm, const Datasets& data, polyshard::Trace* trace);

/// Calls f.template operator()<F>() with the family of the strategy the options name.
template <class Fn>
void with_family(const Options& o, Fn&& f) {
  const std::string& s = o.strategy;
  if (s == "ddp") f.template operator()<Family::ddp>();
  else if (s == "zero1") f.template operator()<Family::zero1>();
  else if (s == "zero2" || s == "sharded_ddp") f.template operator()<Family::zero2>();
  else if (s == "zero3" || s == "fsdp") f.template operator()<Family::zero3>();
  else if (s == "fsdp_grad_op") f.template operator()<Family::fsdp_grad_op>();
  else if (s == "zero1_offload") f.template operator()<Family::zero1_offload>();
  else if (s == "zero_offload") f.template operator()<Family::zero_offload>();
  else if (s == "zero3_offload_optimizer") f.template operator()<Family::zero3_offload_optimizer>();
  else if (s == "zero3_offload") f.template operator()<Family::zero3_offload>();
  else if (s == "zero3_offload_parameters") f.template operator()<Family::zero3_offload_parameters>();
  else if (s == "hybrid") f.template operator()<Family::hybrid>();
  else if (s == "zero_infinity") f.template operator()<Family::zero_infinity>();
  else if (s == "zero_infinity_parameters") f.template operator()<Family::zero_infinity_parameters>();
  // Lightning's registered names, each the family its DeepSpeed or FairScale settings make ("fsdp"
  // above is one too: FairScale's full sharding).
  else if (s == "deepspeed") f.template operator()<Family::zero2>();  // DeepSpeedStrategy()'s stage=2
  else if (s == "deepspeed_stage_1") f.template operator()<Family::zero1>();
  else if (s == "deepspeed_stage_2" || s == "ddp_sharded") f.template operator()<Family::zero2>();
  else if (s == "deepspeed_stage_2_offload") f.template operator()<Family::zero_offload>();
  else if (s == "deepspeed_stage_3") f.template operator()<Family::zero3>();
  else if (s == "deepspeed_stage_3_offload") f.template operator()<Family::zero3_offload>();
  else if (s == "deepspeed_stage_3_offload_nvme") f.template operator()<Family::zero_infinity_parameters>();
  else polyshard::detail::throw_error("polyshard-train: unknown --strategy '", s, "' (see --help)");
}

/// Calls train_strategy<F, P, D>(o, comm, data, trace) with the family and precision the options name.
template <class D, class Comm>
void train_named_strategy(const Options& o, Comm& comm, const Datasets& data, polyshard::Trace* trace) {
  with_family(o, [&]<Family F>() {
    if (o.precision == "fp32") train_strategy<F, Precision::fp32, D>(o, comm, data, trace);
    else if (o.precision == "bf16-mixed") train_strategy<F, Precision::bf16_mixed, D>(o, comm, data, trace);
    else if (o.precision == "fp16-mixed") {
      // Only the families a name of each kind reaches are compiled (strategies.cpp).
      constexpr bool grad_scaler_family = F == Family::ddp || F == Family::zero2 || F == Family::zero3 ||
                                          F == Family::fsdp_grad_op || F == Family::hybrid;
      constexpr bool deepspeed_family = F != Family::ddp && F != Family::fsdp_grad_op && F != Family::hybrid;
      if (scales_as_grad_scaler(o.strategy)) {
        if constexpr (grad_scaler_family) train_strategy<F, Precision::fp16_amp, D>(o, comm, data, trace);
        else polyshard::detail::throw_error("polyshard-train: '", o.strategy, "' has no GradScaler build");
      } else {
        if constexpr (deepspeed_family) train_strategy<F, Precision::fp16_mixed, D>(o, comm, data, trace);
        else polyshard::detail::throw_error("polyshard-train: '", o.strategy, "' has no DeepSpeed-scaler build");
      }
    }
    else polyshard::detail::throw_error("polyshard-train: unknown --precision '", o.precision, "' (see --help)");
  });
}

}  // namespace train
