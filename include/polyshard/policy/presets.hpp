// The strategies users know by name, with the defaults of the documents they come from.
#pragma once

#include "polyshard/policy/strategy.hpp"

namespace polyshard {

/// PyTorch DistributedDataParallel: replicas, gradients all-reduced in buckets of bucket_cap_mb
/// (TorchDefaults, the family's default: 25 MiB).
using DDP = Strategy<NoShard>;

/// FairScale's OSS optimizer with ShardedDataParallel: gradients reduced to the rank owning them,
/// small parameters batched in buckets of reduce_buffer_size's 2^23 elements. ZeRO<2>'s engine,
/// with FairScale's defaults.
using ShardedDDP = Strategy<ShardGradients, FairScaleShardedDefaults>;

/// FairScale's FullyShardedDataParallel as Lightning configures it: reshard_after_forward=True,
/// auto-wrap with min_num_params=1e8, no CPU offload, full precision unless composed otherwise.
using FSDP = Strategy<ShardParameters<true>, WrapBySize<100'000'000>>;

/// DeepSpeed ZeRO stage 0 (disabled), 1 (optimizer state), 2 (and gradients; Lightning's default
/// stage) and 3 (and parameters), with DeepSpeed's defaults (gradient buckets of
/// reduce_bucket_size's 2e8 elements).
template <int Stage>
struct zero_stage;
template <>
struct zero_stage<0> {
  using type = Strategy<NoShard, DeepSpeedDefaults>;
};
template <>
struct zero_stage<1> {
  using type = Strategy<ShardOptimizerState, DeepSpeedDefaults>;
};
template <>
struct zero_stage<2> {
  using type = Strategy<ShardGradients, DeepSpeedDefaults>;
};
template <>
struct zero_stage<3> {
  // Gathered layer by layer, as DeepSpeed gathers submodule by submodule (WrapRepeated's 1e5:
  // DeepSpeed's stage3_param_persistence_threshold).
  using type = Strategy<ShardParameters<true>, WrapRepeated<>, DeepSpeedDefaults>;
};
/// ZeRO<> is stage 2, DeepSpeedStrategy()'s defaults: zero_optimization=True, stage=2.
template <int Stage = 2>
using ZeRO = typename zero_stage<Stage>::type;

/// ZeRO-Offload: stage 2 with optimizer state, master weights and the step on the CPU
/// (Lightning's deepspeed_stage_2_offload).
using ZeROOffload = Strategy<ShardGradients, OffloadOptimizer<Cpu>, DeepSpeedDefaults>;

/// ZeRO-Infinity: stage 3 (layer by layer, as ZeRO<3>) with the optimizer state on NVMe.
using ZeROInfinity = Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, WrapRepeated<>, DeepSpeedDefaults>;

/// ZeRO-Infinity with the parameter shards on NVMe as well (offload_param and offload_optimizer
/// with device nvme: Lightning's deepspeed_stage_3_offload_nvme).
using ZeROInfinityParameters =
    Strategy<ShardParameters<true>, OffloadParameters<Nvme>, WrapRepeated<>, DeepSpeedDefaults>;

}  // namespace polyshard
