// Compile-time accounting: the model-state bytes a rank holds and the bytes it sends per step,
// as functions of a strategy, a parameter count and a world size. The engine's measured
// figures equal these; tests hold it to them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <concepts>
#include <span>
#include <type_traits>

#include "polyshard/core/device.hpp"
#include "polyshard/policy/config.hpp"
#include "polyshard/policy/strategy.hpp"

namespace polyshard {

/// Bytes of parameters, gradients and optimizer state one rank holds between steps, for
/// `params` parameters. Pass the padded count (every unit rounded up to a multiple of the
/// world size, as the engine lays them out: UnitPlan::padded_total()) for exact figures
/// and an optimizer with `states_per_param` state values per parameter (Adam: 2, SGD with
/// momentum: 1, plain SGD: 0).
///   parameters   sizeof(compute)          / N if parameters are sharded
///   gradients    sizeof(reduce)           / N if gradients are sharded
///   optimizer    sizeof(master) * (states + 1 if master weights are a separate copy)
///                                         / N if optimizer state is sharded
/// For mixed-precision Adam this is ZeRO's 2 + 2 + 12 = 16 bytes per parameter: 16 (DDP),
/// 4 + 12/N (stage 1), 2 + 14/N (stage 2), 16/N (stage 3).
/// Under OffloadOptimizer<Nvme> (ZeRO-Infinity) the state values, and a separate master copy,
/// are in the NVMe file between steps: (2 + 2)/N bytes per parameter stay for mixed-precision
/// Adam, (4 + 4)/N in fp32 (the masters are the parameter shards there). During a step, up to
/// the sub-groups optimizer_buffer_count has buffers for come back, state and masters
/// (offloaded_state_bytes_in_step).
/// Under OffloadParameters<Nvme> the parameter shards are in the file too: only the gradients stay,
/// 2/N (max_in_cpu = 0).
/// `rank_shard` >= 0: the rank's shards hold that many elements in all, in place of P/N (uneven
/// shards, ShardPartition::whole_parameters: UnitPlan::uneven_shards).
template <StrategyType S>
constexpr double model_state_bytes(std::int64_t params, int world_size, int states_per_param = 2,
                                   std::int64_t rank_shard = -1) {
  using sharding = typename S::sharding;
  using offload = typename S::offload;
  using CT = typename S::compute_type;
  using RT = typename S::reduce_type;
  using MT = typename S::master_type;
  const double p = static_cast<double>(params), n = static_cast<double>(world_size);
  const double s = rank_shard >= 0 ? static_cast<double>(rank_shard) : p / n;  // the rank's shard
  constexpr bool parameters_in_file = offload::to_nvme && offload::offloads_parameters;
  const double parameters = parameters_in_file ? 0.0 : sizeof(CT) * (sharding::shards_parameters ? s : p);
  const double gradients = sizeof(RT) * (sharding::shards_gradients ? s : p);
  const double resident_states = offload::to_nvme ? 0 : states_per_param;
  const double copies = resident_states + (std::is_same_v<MT, CT> || offload::to_nvme ? 0 : 1);
  const double optimizer = sizeof(MT) * copies * (sharding::shards_optimizer_state ? s : p);
  return parameters + gradients + optimizer;
}

/// What one rank holds between steps, per memory category (core/memory_tracker.hpp), in bytes.
/// Activations are freed with the step, and what a communicator keeps for its collectives is
/// its backend's (the in-process backend's rule is in docs/communication.md).
struct ResidentMemory {
  double parameters = 0, gradients = 0, optimizer_state = 0, working_copies = 0;
  double other = 0;  // NVMe offload's I/O staging buffers
  constexpr double model_state() const { return parameters + gradients + optimizer_state; }
};

/// Every byte of model state one rank holds between steps under S, per category, for a model
/// on device D with `params` padded parameters (UnitPlan::padded_total(), padded for the ranks
/// that shard: the world, or the group under HybridShard, whose size `world_size` then is) and
/// an optimizer of `states_per_param` state values per parameter. Unlike model_state_bytes
/// (ZeRO's formula), it counts the copies the engine really keeps:
///   parameters      sizeof(compute) P        / N if parameters are sharded
///   gradients       sizeof(reduce) P         / N if gradients are sharded; and, where the
///                   local gradients are kept whole in another dtype than the reduce dtype,
///                   the compute-dtype gradients backward writes into, sizeof(compute) P; and
///                   a device's optimizer offloaded to the host steps on a host copy of the
///                   reduced gradients, sizeof(reduce) P / N if optimizer state is sharded
///   optimizer state sizeof(master) (states + 1 if the masters are a copy of their own) P
///                                            / N if optimizer state is sharded; the masters are
///                   the parameters themselves when master and compute dtypes agree and the
///                   optimizer steps where the parameters (or, sharded, their shards) live;
///                   offloaded to NVMe, the states and a separate master copy are in the
///                   file between steps, and under OffloadParameters<Nvme> the parameter shards
///                   but those max_in_cpu keeps: here, as if the model were one unit, all of
///                   them when the rank's P / N fit max_in_cpu and none otherwise (the overload
///                   taking the units counts unit by unit, as the engine keeps them)
///   working copies  on the host with a 16-bit compute dtype, the float copies the modules
///                   compute with: 4 P of parameters unless they are sharded (gathered copies
///                   are freed with their unit), 4 P of gradients unless they are sharded.
///   other           under NVMe offload, the file's staging buffers: queue_depth x block_size
///                   (`config`'s).
/// `rank_shard` >= 0: the rank's shards hold that many elements in all, in place of P / N.
template <StrategyType S, Device D = Cpu>
constexpr ResidentMemory resident_memory(std::int64_t params, int world_size, int states_per_param = 2,
                                         const StrategyConfig& config = {}, std::int64_t rank_shard = -1) {
  using sharding = typename S::sharding;
  using offload = typename S::offload;
  using CT = typename S::compute_type;
  using RT = typename S::reduce_type;
  using MT = typename S::master_type;
  const double p = static_cast<double>(params), n = static_cast<double>(world_size);
  constexpr bool host = std::same_as<D, Cpu>;
  // A host computes in float; a 16-bit compute dtype then has float working copies.
  constexpr bool work_copies = host && !std::is_same_v<CT, float>;
  // Where the optimizer steps, and where the parameters it would alias live.
  constexpr bool steps_elsewhere = !host && offload::offloads_optimizer;
  constexpr bool shards_elsewhere = !host && offload::offloads_parameters;
  constexpr bool masters_alias = std::is_same_v<MT, CT> && (sharding::shards_parameters
                                                                 ? steps_elsewhere == shards_elsewhere
                                                                 : !steps_elsewhere);
  const double s = rank_shard >= 0 ? static_cast<double>(rank_shard) : p / n;  // the rank's shard
  ResidentMemory m;
  constexpr bool parameters_in_file = offload::to_nvme && offload::offloads_parameters;
  m.parameters = sizeof(CT) * (sharding::shards_parameters ? s : p);
  if (parameters_in_file && s > static_cast<double>(config.max_in_cpu)) m.parameters = 0;
  m.gradients = sizeof(RT) * (sharding::shards_gradients ? s : p);
  if (!sharding::shards_gradients && !work_copies && !std::is_same_v<RT, CT>) m.gradients += sizeof(CT) * p;
  // A device's optimizer offloaded to the host steps on a host copy of its reduced gradients.
  if (steps_elsewhere) m.gradients += sizeof(RT) * (sharding::shards_optimizer_state ? s : p);
  const double states = offload::to_nvme ? 0 : states_per_param;
  const double masters = masters_alias || offload::to_nvme ? 0 : 1;  // a copy of their own, in memory
  m.optimizer_state = sizeof(MT) * (states + masters) * (sharding::shards_optimizer_state ? s : p);
  if (offload::to_nvme) m.other = static_cast<double>(config.queue_depth) * static_cast<double>(config.block_size);
  if (work_copies) {
    if (!sharding::shards_parameters) m.working_copies += sizeof(float) * p;
    if (!sharding::shards_gradients) m.working_copies += sizeof(float) * p;
  }
  return m;
}

/// How many units OffloadParameters<Nvme> keeps in host memory: the first ones, in unit order,
/// up to the first whose shard would take their sum past max_in_cpu elements. `units` are the
/// padded unit sizes (UnitPlan), `world_size` the ranks that shard them.
inline std::size_t nvme_units_in_memory(std::span<const std::int64_t> units, int world_size, std::int64_t max_in_cpu) {
  std::int64_t kept = 0;
  std::size_t i = 0;
  for (; i < units.size() && kept + units[i] / world_size <= max_in_cpu; ++i) kept += units[i] / world_size;
  return i;
}

/// The parameter elements (per rank: shard elements) of the units nvme_units_in_memory keeps.
inline std::int64_t nvme_parameters_in_memory(std::span<const std::int64_t> units, int world_size,
                                              std::int64_t max_in_cpu) {
  std::int64_t kept = 0;
  for (std::size_t i = 0; i < nvme_units_in_memory(units, world_size, max_in_cpu); ++i) kept += units[i] / world_size;
  return kept;
}

/// The elements of a rank's uneven shards in all (UnitPlan::uneven_shards: one a unit), as the
/// functions here take them; -1 (P / N) for none.
inline std::int64_t rank_shard_elements(std::span<const std::int64_t> shards) {
  if (shards.empty()) return -1;
  std::int64_t n = 0;
  for (const std::int64_t s : shards) n += s;
  return n;
}

/// resident_memory with the unit sizes (padded, root first): under OffloadParameters<Nvme>, the
/// parameter shards max_in_cpu keeps in memory counted unit by unit (nvme_parameters_in_memory);
/// for every other strategy, resident_memory of their sum. `shards`: the rank's shard of each
/// unit where they are uneven (UnitPlan::uneven_shards); empty: P / N each.
template <StrategyType S, Device D = Cpu>
ResidentMemory resident_memory(std::span<const std::int64_t> units, int world_size, int states_per_param = 2,
                               const StrategyConfig& config = {}, std::span<const std::int64_t> shards = {}) {
  std::int64_t total = 0;
  for (std::int64_t u : units) total += u;
  ResidentMemory m = resident_memory<S, D>(total, world_size, states_per_param, config, rank_shard_elements(shards));
  if constexpr (S::offload::to_nvme && S::offload::offloads_parameters)
    m.parameters = static_cast<double>(sizeof(typename S::compute_type)) *
                   static_cast<double>(nvme_parameters_in_memory(units, world_size, config.max_in_cpu));
  return m;
}

/// The most bytes of optimizer state values (and separate master weights) that an offloading
/// strategy brings back into memory during a step, on top of model_state_bytes: offloaded to
/// NVMe, the sub-groups' state and masters that `buffer_count` (StrategyConfig::
/// optimizer_buffer_count) has buffers for (nvme_sub_groups_in_memory, with
/// `states_per_param` the optimizer's own states) at most, bounded here by as many copies of a
/// sub-group of the largest unit (`largest_unit_params` padded parameters, 1/N of them per
/// rank, as ZeRO-Infinity is stage 3, in sub-groups of at most `sub_group_size`); the masters
/// count where they are a copy of their own, as in model_state_bytes (mixed precision); 0 for
/// every other strategy, whose state never leaves.
template <StrategyType S>
constexpr double offloaded_state_bytes_in_step(std::int64_t largest_unit_params, int world_size, int buffer_count,
                                               int states_per_param = 2,
                                               std::int64_t sub_group_size = 1'000'000'000'000) {
  using MT = typename S::master_type;
  using CT = typename S::compute_type;
  if constexpr (!S::offload::to_nvme) {
    return 0.0;
  } else {
    const double shard = static_cast<double>(largest_unit_params) / static_cast<double>(world_size);
    const double group = std::min(shard, static_cast<double>(sub_group_size));
    const double values = states_per_param + (std::is_same_v<MT, CT> ? 0 : 1);
    return static_cast<double>(nvme_sub_groups_in_memory(buffer_count, states_per_param)) * values * sizeof(MT) *
           group;
  }
}

/// Bytes one rank sends per training step under ring collectives (all-reduce 2(N-1)/N of the
/// buffer, reduce-scatter and all-gather (N-1)/N): `params` is the padded parameter count of
/// all units, `root_params` that of the root unit (gathered once per step under parameter
/// sharding, since it stays gathered from forward to backward; every other unit is gathered
/// twice unless reshard_after_forward is false). `norm` adds the all-reduce of the squared
/// gradient norm that clipping a sharded gradient needs; loss scaling adds that of the
/// overflow flag.
///   NoShard                    2(N-1)/N * P * sizeof(reduce)
///   ShardOptimizerState/Grads  (N-1)/N * P * (sizeof(reduce) + sizeof(compute))
///   ShardParameters            (N-1)/N * (P * sizeof(reduce) + (2P - root) * sizeof(compute))
/// Under HybridShard, `group_size` ranks shard (N above is the group size) and each shard's
/// gradient is then all-reduced across the world_size / group_size groups: 2(R-1)/R * P/N *
/// sizeof(reduce) more (the rank's shards s instead of P/N where they are uneven). Pass the
/// parameter count padded for the group size.
/// `rank_shard` (ShardPartition::whole_parameters: the rank's uneven shards in all,
/// rank_shard_elements; -1 for even ones): each unit's gradients are reduced to each rank's
/// shard and the shards broadcast from their owners, which a ring sends whole: P *
/// (sizeof(reduce) + sizeof(compute)) for ShardOptimizerState and ShardGradients.
template <StrategyType S>
constexpr double bytes_sent_per_step(std::int64_t params, std::int64_t root_params, int world_size,
                                     bool norm = false, int group_size = 0, std::int64_t rank_shard = -1) {
  const bool uneven_shards = rank_shard >= 0;
  using sharding = typename S::sharding;
  using CT = typename S::compute_type;
  using RT = typename S::reduce_type;
  const int shard_ranks = sharding::hybrid && group_size > 0 ? group_size : world_size;
  const double n = static_cast<double>(shard_ranks), f = (n - 1.0) / n;
  const double p = static_cast<double>(params), root = static_cast<double>(root_params);
  double bytes = 0;
  if constexpr (!sharding::shards_optimizer_state) {
    bytes = 2.0 * f * p * sizeof(RT);
  } else if constexpr (!sharding::shards_parameters) {
    bytes = (uneven_shards && shard_ranks > 1 ? 1.0 : f) * p * (sizeof(RT) + sizeof(CT));
  } else {
    const double gathers = sharding::reshard_after_forward ? 2.0 : 1.0;
    bytes = f * (p * sizeof(RT) + (root + gathers * (p - root)) * sizeof(CT));
  }
  if (S::precision::loss_scale::scaled) bytes += 2.0 * f * sizeof(float);
  if (norm && sharding::shards_optimizer_state) bytes += 2.0 * f * sizeof(double);
  if (sharding::hybrid) {
    const double groups = static_cast<double>(world_size) / n;
    const double shard = uneven_shards ? static_cast<double>(rank_shard) : p / n;
    bytes += 2.0 * (groups - 1.0) / groups * shard * sizeof(RT);
  }
  return bytes;
}

}  // namespace polyshard
