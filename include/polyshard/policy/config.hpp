// Runtime settings of a strategy that are not worth a type: bucket sizes, NVMe paths, flags.
// Names and defaults follow the reference documents (FairScale FSDP and ShardedDataParallel,
// DeepSpeed through Lightning).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "polyshard/core/device.hpp"
#include "polyshard/core/error.hpp"

namespace polyshard {

/// How a unit is cut into the ranks' shards where the optimizer state (and gradients) are sharded
/// but the parameters are whole (ShardOptimizerState, ShardGradients).
enum class ShardPartition {
  /// Equal slices of the unit's flat buffer, a parameter possibly split between ranks (DeepSpeed's
  /// stages 1 and 2; FSDP's flat parameters).
  flat_slices,
  /// Every parameter whole on one rank, as FairScale's OSS partitions them: in the model's order,
  /// each goes to the rank holding the fewest elements so far (a frozen one counts as one
  /// element); each rank's shard of a unit is its parameters, of its own size, reduced to it and
  /// broadcast from it (engine/parameter_partition.hpp).
  whole_parameters,
};

/// "flat_slices" or "whole_parameters", as StrategyConfig and polyshard-train name them.
constexpr const char* partition_name(ShardPartition p) {
  return p == ShardPartition::whole_parameters ? "whole_parameters" : "flat_slices";
}

struct StrategyConfig {
  // Gradient reduction. Gradients are reduced in buckets, each launched as soon as backward has
  // finished it (engine/gradient_buckets.hpp), cut by the caps below: the smallest of those set,
  // and where none is set, the cap of the strategy's reference (its DefaultsPolicy: DDP's and
  // FSDP's bucket_cap_mb of 25, ShardedDDP's reduce_buffer_size of 2^23, the ZeRO presets'
  // reduce_bucket_size of 2e8).
  /// PyTorch DDP's and FairScale FSDP's bucket_cap_mb: MiB of the reduce dtype in a bucket;
  /// <= 0: no cap from it (one bucket a unit, unless another cap is set).
  std::optional<double> bucket_cap_mb{};
  /// DeepSpeed's reduce_bucket_size: elements in a bucket (Lightning's default 2e8).
  std::optional<std::int64_t> reduce_bucket_size{};
  /// FairScale ShardedDataParallel's reduce_buffer_size: the most elements a bucket batching small
  /// parameters holds; a parameter of that many elements or more is reduced alone, and 0 reduces
  /// every parameter alone (no batching). The ShardedDDP preset's cap, 2^23
  /// (fairscale_reduce_buffer_size); polyshard-train's ddp_sharded sets Lightning's (0 on one
  /// machine, 2^23 across machines).
  std::optional<std::int64_t> reduce_buffer_size{};
  /// DeepSpeed's allgather_bucket_size: under ShardOptimizerState and ShardGradients (DeepSpeed's
  /// stages 1 and 2), the most elements one all-gather of the updated shards moves after the
  /// step: a unit's is cut into as many as that takes (allgather_piece_elements). Refused set
  /// elsewhere: NoShard gathers nothing, and under ShardParameters, as under DeepSpeed's stage 3,
  /// the updated shards stay where they are (what is gathered ahead of compute is bounded by
  /// stage3_prefetch_bucket_size).
  std::int64_t allgather_bucket_size = 200'000'000;
  /// DeepSpeed's stage3_prefetch_bucket_size: under ShardParameters, the elements of the units a
  /// rank gathers ahead of the one computing. Set, units are prefetched, in the order the last
  /// forward ran them, as deep as it allows, and at least the next one; unset, the next unit
  /// only, so that ZeRO-3 and FSDP out of the box hold two gathered units beside the root
  /// (DeepSpeed's own 5e7 comes with a DeepSpeed JSON config, whose 0 is prefetch = false).
  std::optional<std::int64_t> stage3_prefetch_bucket_size{};
  /// How ShardOptimizerState and ShardGradients cut a unit into shards: FairScale's OSS gives each
  /// parameter whole to one rank (whole_parameters), DeepSpeed's stages 1 and 2 slice the flat
  /// buffer evenly (flat_slices). Unset: the strategy's reference's (its DefaultsPolicy: the
  /// ShardedDDP preset's is whole_parameters). whole_parameters is refused where the parameters
  /// are sharded or nothing is (their shards are even slices).
  std::optional<ShardPartition> partition{};
  /// Reduce each gradient bucket as soon as backward has finished it, while backward goes on
  /// (on the communication thread or stream), and complete a unit's reductions only when the
  /// next unit's are done. Off: each unit's buckets are reduced, and waited for, when the
  /// unit's backward is done.
  bool overlap_comm = true;
  /// ShardParameters: gather the next unit, in the order units ran in the last forward (reversed
  /// in backward), while the current one computes; a rank then holds up to two gathered units.
  bool prefetch = true;
  /// FSDP's min_num_params for size-based wrapping (WrapBySize): a value >= 1 here replaces
  /// the policy's own threshold at run time; 0 keeps the policy's.
  std::int64_t min_num_params = 0;
  /// DeepSpeed's gradient_accumulation_steps (default 1), the micro-batches of one optimizer
  /// step, counted by the engine as DeepSpeed's engine counts them: the caller runs forward,
  /// backward() and step() for every micro-batch; backward() scales the loss by
  /// 1 / gradient_accumulation_steps and reduces nothing until the step's last micro-batch
  /// (as under no_sync), and step() updates the parameters only on that one.
  int gradient_accumulation_steps = 1;

  /// HybridShard: ranks per sharding group (consecutive ranks, a node typically); groups
  /// replicate each other. 0: the whole world is one group.
  int hybrid_group_size = 0;

  // Model synchronisation (FairScale ShardedDataParallel).
  /// Broadcast the model's buffers (Buffer members: running statistics) from rank 0 before each
  /// forward, so that every rank computes with rank 0's; GPT has none.
  bool broadcast_buffers = true;
  /// Broadcast rank 0's parameters at start-up; not needed when every rank uses the same seed.
  bool sync_models_at_startup = true;
  /// When a parameter's requires_grad changed since the engine last read the flags, forward()
  /// reads them again (Engine::refresh_trainable) instead of refusing to run (FairScale's
  /// auto_refresh_trainable). Off: forward() throws, naming the parameter, until the caller
  /// calls refresh_trainable().
  bool auto_refresh_trainable = true;
  /// With auto_refresh_trainable, each refresh writes a warning naming the parameters that
  /// changed to std::clog (FairScale's warn_on_trainable_params_changed).
  bool warn_on_trainable_params_changed = true;

  // Loss scaling (DeepSpeed's fp16 keys, Lightning's DeepSpeedStrategy arguments). The precision
  // policy chooses the scaler (engine/loss_scaler.hpp); these settle its numbers at run time.
  // Each is refused, naming it, where the policy's scaler has no such setting.
  /// 0 means dynamic when the precision policy scales dynamically; a positive value overrides
  /// the policy's initial scale with a static one.
  double loss_scale = 0;
  /// The dynamic scale starts at 2^initial_scale_power. Unset: the policy's (16 for
  /// DynamicLossScale<> and GradScalerLossScale<>: DeepSpeed's default, and PyTorch's 65536).
  std::optional<int> initial_scale_power{};
  /// Steps in a row without overflow after which the scale doubles (DeepSpeed's
  /// loss_scale_window; PyTorch's growth_interval). Unset: the policy's (1000; PyTorch's 2000).
  std::optional<int> loss_scale_window{};
  /// Overflows that skip their step before the scale halves (DeepSpeed's delayed_shift).
  /// DeepSpeed's scaler only. Unset: the policy's (2).
  std::optional<int> hysteresis{};
  /// The dynamic scale never halves below this. DeepSpeed's scaler only. Unset: the policy's (1).
  std::optional<double> min_loss_scale{};

  // Offload to host memory (DeepSpeed's ZeRO-Offload).
  /// Delayed parameter update (ZeRO-Offload's DPU), under OffloadOptimizer<Cpu>: the optimizer
  /// step of step k runs on a host thread while the forward and backward of step k+1 run, which
  /// therefore compute with the parameters of step k-1; step k+1's own step() waits for it and
  /// writes its parameters back first. The device then never waits on the host optimizer, at the
  /// price of a gradient one step stale (the ZeRO-Offload paper turns it on only after the first
  /// steps of training). Off by default.
  bool delayed_parameter_update = false;

  // Where parameters are built (DeepSpeed's zero.Init).
  /// Lightning DeepSpeedStrategy's remote_device: where the model is first instantiated, "cpu"
  /// or "nvme"; empty (its None), where training keeps the parameters. The engine builds each
  /// rank's shards straight there (host memory under OffloadParameters<Cpu> and on a host model,
  /// the rank's file under OffloadParameters<Nvme>, unit by unit) and never the whole model
  /// anywhere, so the place that names it is accepted and another refused: built elsewhere first,
  /// the shards would only be copied over.
  std::string remote_device{};

  // NVMe offload (DeepSpeed).
  std::string nvme_path = "/local_nvme";
  std::int64_t block_size = 1'048'576;
  int queue_depth = 8;
  bool pin_memory = false;
  /// DeepSpeed's optimizer_buffer_count: the buffers, each of one sub-group's tensor, through
  /// which optimizer state offloaded to NVMe comes into memory; a sub-group takes as many as
  /// DeepSpeed counts states per parameter (nvme_buffers_per_sub_group: 4 for Adam), so the
  /// default keeps one Adam sub-group in memory at a time, and eight would let the next one be
  /// read while one steps. Fewer than one sub-group takes is refused.
  int optimizer_buffer_count = 4;
  // Parameter shards on NVMe (OffloadParameters<Nvme>, DeepSpeed's offload_param): at most
  // params_buffer_count units' shards in memory at once, each at most params_buffer_size
  // elements; the first units' shards, up to max_in_cpu elements in all, stay in host memory.
  int params_buffer_count = 5;
  std::int64_t params_buffer_size = 100'000'000;
  std::int64_t max_in_cpu = 1'000'000'000;
  // The most elements the optimizer steps at once (DeepSpeed's sub_group_size): each unit's
  // optimizer span is stepped in sub-groups of at most this many, each with state of its own,
  // which an offload to NVMe brings into memory one sub-group at a time.
  std::int64_t sub_group_size = 1'000'000'000'000;

  // Full state dicts (FSDP): full_state_dict() gathers the parameters into host memory (true),
  // or leaves them in the memory of the model's device (false).
  bool state_dict_to_cpu = true;

  // Activation checkpointing (DeepSpeed's activation_checkpointing section): what the checkpoints
  // that ActivationCheckpointing or the model itself asks for do on a device model
  // (CheckpointSettings, autograd/checkpoint.hpp). Refused on a host model, and by forward()
  // when nothing was checkpointed.
  /// Each checkpoint's input waits in page-locked host memory from the end of its block's forward
  /// to its recomputation in backward.
  bool cpu_checkpointing = false;
  /// With cpu_checkpointing: those inputs are slices of one page-locked buffer, reused from step to
  /// step, instead of an allocation each.
  bool contiguous_memory_optimization = false;
  /// DeepSpeed's number_checkpoints, with contiguous_memory_optimization: the buffer is allocated
  /// for this many inputs of the first one's size, from the first step on; 0 (unset): sized by the
  /// step before.
  std::int64_t number_checkpoints = 0;
  /// The device is synchronized as each checkpoint's forward and recomputation begin and end.
  bool synchronize_checkpoint_boundary = false;

  // Gradients (FairScale FSDP).
  /// FSDP's move_grads_to_cpu: whether the reduced gradient shards go to host memory. They do
  /// exactly where the optimizer steps there: under OffloadOptimizer or OffloadParameters, and on
  /// a host model, whose gradients are in host memory already. Unset, it follows the composition,
  /// as FSDP's default follows cpu_offload; set to what the composition does, it is accepted, and
  /// set otherwise refused, naming the offload policy that gives it.
  std::optional<bool> move_grads_to_cpu{};
};

/// FairScale ShardedDataParallel's default reduce_buffer_size: 2^23 elements.
inline constexpr std::int64_t fairscale_reduce_buffer_size = 8'388'608;
/// PyTorch DDP's and FairScale FSDP's default bucket_cap_mb: 25 MiB.
inline constexpr double torch_bucket_cap_mb = 25;
/// Lightning DeepSpeedStrategy's default reduce_bucket_size: 2e8 elements (DeepSpeed's own
/// config default, which a DeepSpeed JSON config without the key gets, is 5e8).
inline constexpr std::int64_t lightning_reduce_bucket_size = 200'000'000;

/// The sizes of the sub-groups a span of `numel` elements is stepped in: as many of
/// `group_size` as fit, then the rest. A span of 0 elements is one empty group.
inline std::vector<std::int64_t> sub_group_sizes(std::int64_t numel, std::int64_t group_size) {
  POLYSHARD_CHECK(group_size >= 1, "StrategyConfig::sub_group_size (elements the optimizer steps at once) must be ",
                  "at least 1, got ", group_size);
  std::vector<std::int64_t> sizes;
  for (std::int64_t at = 0; at < numel; at += group_size) sizes.push_back(std::min(group_size, numel - at));
  if (sizes.empty()) sizes.push_back(0);
  return sizes;
}

/// The buffers of optimizer_buffer_count a sub-group of optimizer state offloaded to NVMe takes:
/// its states per parameter as DeepSpeed counts them, the optimizer's own (`optimizer_states`:
/// Adam's two moments, SGD's momentum) with the fp32 parameter and its gradient.
constexpr int nvme_buffers_per_sub_group(int optimizer_states) { return optimizer_states + 2; }

namespace detail {
[[noreturn]] inline void refuse_optimizer_buffer_count(int buffer_count, int optimizer_states) {
  throw_error("StrategyConfig::optimizer_buffer_count is ", buffer_count, ", fewer than the ",
              nvme_buffers_per_sub_group(optimizer_states), " buffers one sub-group of this optimizer's state takes ",
              "(its states per parameter as DeepSpeed counts them: ", optimizer_states,
              " of the optimizer's own, the fp32 parameter and its gradient; Adam's are 4)");
}
}  // namespace detail

/// How many sub-groups' optimizer state (and their separate fp32 masters) an offload to NVMe
/// may hold in memory at once: the optimizer_buffer_count buffers, nvme_buffers_per_sub_group
/// each. Refuses fewer buffers than one sub-group takes.
constexpr int nvme_sub_groups_in_memory(int buffer_count, int optimizer_states) {
  if (buffer_count < nvme_buffers_per_sub_group(optimizer_states))
    detail::refuse_optimizer_buffer_count(buffer_count, optimizer_states);
  return buffer_count / nvme_buffers_per_sub_group(optimizer_states);
}

namespace detail {
/// A policy's name for a message: its `name`, which a policy of the user's may leave out.
template <class P>
constexpr const char* policy_name() {
  if constexpr (requires { P::name; }) return P::name;
  else return "a policy of its own";
}
}  // namespace detail

/// Refuses, naming it, a field set away from its default that strategy S never reads: the NVMe
/// settings (nvme_path, block_size, queue_depth, optimizer_buffer_count) without an offload to
/// NVMe, hybrid_group_size without HybridShard, prefetch and stage3_prefetch_bucket_size without
/// sharded parameters (nothing is gathered ahead), allgather_bucket_size without stages 1 and 2's
/// all-gather of updated shards, partition = whole_parameters but under those stages,
/// min_num_params without a size-based wrap policy, pin_memory where no host buffer moves to or
/// from a device or NVMe, move_grads_to_cpu against where the optimizer steps, cpu_checkpointing
/// and synchronize_checkpoint_boundary on a host model, contiguous_memory_optimization without
/// cpu_checkpointing, number_checkpoints without contiguous_memory_optimization, a remote_device
/// other than where the shards are built (D: where the model computes), and allgather_bucket_size
/// beside partition = whole_parameters (whose shards are broadcast, not all-gathered). A user who
/// sets one expects it to act; a run that ignores it is a silently different run. Engine's
/// constructor calls it on the config its strategy's reference defaults filled in.
template <class S, class D = Cpu>
void refuse_fields_not_read_by(const StrategyConfig& c) {
  [[maybe_unused]] const char* offload = detail::policy_name<typename S::offload>();
  [[maybe_unused]] const char* sharding = detail::policy_name<typename S::sharding>();
  [[maybe_unused]] const char* wrap = detail::policy_name<typename S::wrap>();
  const StrategyConfig d;
  if constexpr (!S::offload::to_nvme) {
    POLYSHARD_CHECK(c.nvme_path == d.nvme_path && c.block_size == d.block_size && c.queue_depth == d.queue_depth &&
                        c.optimizer_buffer_count == d.optimizer_buffer_count,
                    "StrategyConfig's NVMe settings (nvme_path '", c.nvme_path, "', block_size ", c.block_size,
                    ", queue_depth ", c.queue_depth, ", optimizer_buffer_count ", c.optimizer_buffer_count,
                    ") are read only under an offload to NVMe, and this strategy's offload is ", offload,
                    ": leave them at their defaults ('", d.nvme_path, "', ", d.block_size, ", ", d.queue_depth, ", ",
                    d.optimizer_buffer_count, ")");
  }
  if constexpr (!S::offload::to_nvme || !S::offload::offloads_parameters) {
    POLYSHARD_CHECK(c.params_buffer_count == d.params_buffer_count && c.params_buffer_size == d.params_buffer_size &&
                        c.max_in_cpu == d.max_in_cpu,
                    "StrategyConfig::params_buffer_count (", c.params_buffer_count, "), params_buffer_size (",
                    c.params_buffer_size, ") and max_in_cpu (", c.max_in_cpu, ") are read only under ",
                    "OffloadParameters<Nvme> (parameter shards on NVMe), and this strategy's offload is ", offload,
                    ": leave them at their defaults (", d.params_buffer_count, ", ", d.params_buffer_size, ", ",
                    d.max_in_cpu, ")");
  }
  if constexpr (!S::offload::offloads_optimizer || S::offload::to_nvme) {
    POLYSHARD_CHECK(!c.delayed_parameter_update, "StrategyConfig::delayed_parameter_update is read only under ",
                    "OffloadOptimizer<Cpu> (the host steps while the next forward and backward run), and this ",
                    "strategy's offload is ", offload, ": leave it false");
  }
  if constexpr (!S::offload::to_nvme &&
                (std::same_as<D, Cpu> || (!S::offload::offloads_optimizer && !S::offload::offloads_parameters))) {
    POLYSHARD_CHECK(!c.pin_memory, "StrategyConfig::pin_memory = true page-locks the host buffers that move to or ",
                    "from a device or NVMe, and this run has none (", offload, " on ",
                    std::same_as<D, Cpu> ? "a host model" : "a device model",
                    "): leave it false, or offload to NVMe, or offload a device model's state to the host");
  }
  if constexpr (std::same_as<D, Cpu>) {
    POLYSHARD_CHECK(!c.cpu_checkpointing, "StrategyConfig::cpu_checkpointing = true moves a device model's ",
                    "checkpointed activations to host memory, and a host model's are there already: leave it false");
    POLYSHARD_CHECK(!c.synchronize_checkpoint_boundary, "StrategyConfig::synchronize_checkpoint_boundary = true ",
                    "waits for a device at each checkpoint boundary, and a host model computes as it is asked: leave ",
                    "it false");
  }
  POLYSHARD_CHECK(c.cpu_checkpointing || !c.contiguous_memory_optimization,
                  "StrategyConfig::contiguous_memory_optimization = true places the checkpointed inputs that ",
                  "cpu_checkpointing moves to host memory in one buffer, and cpu_checkpointing is false: set it too, ",
                  "or leave contiguous_memory_optimization false");
  POLYSHARD_CHECK(c.number_checkpoints >= 0 && (c.number_checkpoints == 0 || c.contiguous_memory_optimization),
                  "StrategyConfig::number_checkpoints (", c.number_checkpoints, ") sizes the one buffer of ",
                  "contiguous_memory_optimization, in checkpointed inputs: at least 1 with it, or leave it 0");
  constexpr bool grads_to_host = std::same_as<D, Cpu> || S::offload::offloads_optimizer;
  if (c.move_grads_to_cpu.has_value() && *c.move_grads_to_cpu != grads_to_host) {
    if constexpr (std::same_as<D, Cpu>)
      detail::throw_error("StrategyConfig::move_grads_to_cpu = false: a host model's gradients are in host memory ",
                          "already: leave it unset or true");
    else if constexpr (grads_to_host)
      detail::throw_error("StrategyConfig::move_grads_to_cpu = false would keep the gradient shards on the device, ",
                          "and this strategy's offload is ", offload, ", whose optimizer steps in host memory and ",
                          "needs them there (FSDP's cpu_offload sets it): leave it unset or true");
    else
      detail::throw_error("StrategyConfig::move_grads_to_cpu = true moves the reduced gradient shards to host memory ",
                          "for an optimizer that steps there, and this strategy's offload is ", offload, ", whose ",
                          "optimizer steps on the device: offload the optimizer (OffloadOptimizer<Cpu>; ",
                          "polyshard-train --strategy zero3_offload_optimizer), or leave it unset");
  }
  {
    constexpr bool built_on_nvme = S::offload::offloads_parameters && S::offload::to_nvme;
    constexpr bool built_on_host = !built_on_nvme && (std::same_as<D, Cpu> || S::offload::offloads_parameters);
    const char* where = built_on_nvme ? "the rank's NVMe file (OffloadParameters<Nvme>)"
                        : built_on_host ? (std::same_as<D, Cpu> ? "host memory (a host model)"
                                                                 : "host memory (OffloadParameters<Cpu>)")
                                        : "the device (a device model whose parameters stay there)";
    POLYSHARD_CHECK(c.remote_device.empty() || c.remote_device == "cpu" || c.remote_device == "nvme",
                    "StrategyConfig::remote_device = '", c.remote_device, "': must be cpu, nvme, or empty (where ",
                    "training keeps the parameters)");
    POLYSHARD_CHECK(c.remote_device.empty() || (c.remote_device == "cpu" && built_on_host) ||
                        (c.remote_device == "nvme" && built_on_nvme),
                    "StrategyConfig::remote_device = '", c.remote_device, "' builds the parameters there first, and ",
                    "this run (", offload, ") keeps and builds each rank's shards in ", where, ", never the whole ",
                    "model anywhere: built elsewhere first they would only be copied over. Leave it empty, or ",
                    "offload the parameters there (OffloadParameters<",
                    c.remote_device == "nvme" ? "Nvme" : "Cpu", ">)");
  }
  if constexpr (!S::sharding::hybrid) {
    POLYSHARD_CHECK(c.hybrid_group_size == d.hybrid_group_size, "StrategyConfig::hybrid_group_size = ",
                    c.hybrid_group_size, " is read only by HybridShard, and this strategy shards with ",
                    sharding, ": leave it at 0");
  }
  if constexpr (!S::sharding::shards_parameters) {
    POLYSHARD_CHECK(c.prefetch == d.prefetch, "StrategyConfig::prefetch = false is read only by ShardParameters ",
                    "(which gathers units), and this strategy shards with ", sharding,
                    ": leave it true");
  }
  if constexpr (!S::sharding::shards_optimizer_state || S::sharding::shards_parameters) {
    POLYSHARD_CHECK(c.allgather_bucket_size == d.allgather_bucket_size, "StrategyConfig::allgather_bucket_size = ",
                    c.allgather_bucket_size, " cuts the all-gather of the updated shards under ShardOptimizerState ",
                    "and ShardGradients (DeepSpeed's stages 1 and 2), and this strategy shards with ", sharding,
                    ", which has no such all-gather (DeepSpeed's stage 3 does not read it either; what sharded ",
                    "parameters gather ahead is stage3_prefetch_bucket_size): leave it at 200000000");
    POLYSHARD_CHECK(c.partition != ShardPartition::whole_parameters, "StrategyConfig::partition = whole_parameters ",
                    "gives each parameter whole to one rank, as FairScale's OSS shards the optimizer state of whole ",
                    "parameters (ShardOptimizerState, ShardGradients), and this strategy shards with ", sharding,
                    S::sharding::shards_parameters ? ", whose parameter shards are even slices of each unit"
                                                   : ", which partitions nothing",
                    ": leave it unset or flat_slices");
  }
  POLYSHARD_CHECK(c.partition != ShardPartition::whole_parameters || c.allgather_bucket_size == d.allgather_bucket_size,
                  "StrategyConfig::allgather_bucket_size = ", c.allgather_bucket_size, " cuts the all-gather of equal ",
                  "shards (DeepSpeed's stages 1 and 2), and partition = whole_parameters broadcasts each rank's ",
                  "parameters from it, as FairScale's OSS does: leave it at 200000000, or set partition = flat_slices");
  POLYSHARD_CHECK(c.allgather_bucket_size > 0, "StrategyConfig::allgather_bucket_size = ", c.allgather_bucket_size,
                  ": a number of elements must be positive");
  if (c.stage3_prefetch_bucket_size) {
    POLYSHARD_CHECK(S::sharding::shards_parameters, "StrategyConfig::stage3_prefetch_bucket_size = ",
                    *c.stage3_prefetch_bucket_size, " bounds what ShardParameters gathers ahead of compute, and this ",
                    "strategy shards with ", sharding, ", which gathers no parameters: leave it unset");
    POLYSHARD_CHECK(*c.stage3_prefetch_bucket_size > 0, "StrategyConfig::stage3_prefetch_bucket_size = ",
                    *c.stage3_prefetch_bucket_size, ": a number of elements must be positive (prefetch = false ",
                    "gathers nothing ahead)");
    POLYSHARD_CHECK(c.prefetch, "StrategyConfig::stage3_prefetch_bucket_size = ", *c.stage3_prefetch_bucket_size,
                    " is a prefetch budget, and prefetch = false gathers nothing ahead: set only one of them");
  }
  if constexpr (S::wrap::min_num_params == 0) {
    POLYSHARD_CHECK(c.min_num_params == d.min_num_params, "StrategyConfig::min_num_params = ", c.min_num_params,
                    " is read only by a size-based wrap policy (WrapBySize), and this strategy wraps with ",
                    wrap, ": leave it at 0");
  }
}

/// Elements of each rank's shard of `shard` elements that one all-gather of the updated shards
/// takes after the step over `ranks` ranks (ShardOptimizerState, ShardGradients), so that it
/// moves at most allgather_bucket_size elements, and at least one of each rank's; 0 where the
/// whole shard goes at once.
inline std::int64_t allgather_piece_elements(const StrategyConfig& c, int ranks, std::int64_t shard) {
  const std::int64_t piece = std::max<std::int64_t>(1, c.allgather_bucket_size / std::max(ranks, 1));
  return piece >= shard ? 0 : piece;
}

/// The most elements of parameters ShardParameters holds gathered ahead of the unit computing,
/// the next unit excepted, which is prefetched whatever its size: stage3_prefetch_bucket_size,
/// or 0 where it is unset (the next unit only).
inline std::int64_t prefetch_budget_elements(const StrategyConfig& c) {
  return c.stage3_prefetch_bucket_size.value_or(0);
}

}  // namespace polyshard
