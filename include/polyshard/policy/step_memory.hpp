// The most memory a rank holds during one training step, per category: what resident_memory
// (accounting.hpp) predicts between steps, plus what the step's schedule adds for a while --
// gathered parameters, whole gradients waiting for their reduction, the copies collectives
// read from, the optimizer state NVMe offload brings back.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <span>
#include <type_traits>
#include <vector>

#include "polyshard/policy/accounting.hpp"

namespace polyshard {

/// Peak bytes per memory category within one step (core/memory_tracker.hpp's categories; the
/// activations are the model's and are measured, not predicted: Engine::activation_bytes()).
struct StepPeakMemory {
  double parameters = 0, gradients = 0, optimizer_state = 0, working_copies = 0;
  double communication = 0;  // the engine's own buffers; a backend's scratch comes on top
  double other = 0;
};

namespace detail {
/// The largest sum of `width` (at least 1) consecutive values, fewer at the end: what NVMe
/// offload's buffers hold at most when each unit in turn comes back with the next ones.
inline double largest_window_sum(const std::vector<double>& values, int width) {
  const auto w = static_cast<std::size_t>(std::max(width, 1));
  double most = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    double window = 0;
    for (std::size_t j = i; j < std::min(values.size(), i + w); ++j) window += values[j];
    most = std::max(most, window);
  }
  return most;
}

/// Live bytes per category while the walk below replays a step, and the most seen.
class StepMemoryWalk {
 public:
  enum Category : std::size_t { parameters, gradients, optimizer_state, working_copies, communication, other, count };

  explicit StepMemoryWalk(const ResidentMemory& start)
      : live_{start.parameters, start.gradients, start.optimizer_state, start.working_copies, 0, start.other},
        peak_(live_) {}

  void add(Category c, double bytes) {
    live_[c] += bytes;
    peak_[c] = std::max(peak_[c], live_[c]);
  }
  void sub(Category c, double bytes) { live_[c] -= bytes; }
  double peak(Category c) const { return peak_[c]; }

 private:
  std::array<double, count> live_;
  std::array<double, count> peak_;
};
}  // namespace detail

/// The sizes of the sub-groups the optimizers of `optimizers` step apart (Engine::optimizers():
/// one OptimizerGroups a unit), unit after unit: host_step_peak_memory's `sub_groups`.
template <class Groups>
std::vector<std::int64_t> optimizer_sub_group_sizes(const std::vector<Groups>& optimizers) {
  std::vector<std::int64_t> sizes;
  for (const Groups& groups : optimizers)
    for (std::size_t k = 0; k < groups.size(); ++k) sizes.push_back(groups.numel(k));
  return sizes;
}

/// The peak bytes per category one rank holds during a steady-state training step (a forward,
/// a backward, an optimizer step; after the first step, so that prefetching knows the order)
/// of a host model (Gpt<float>) under S, on `world_size` ranks, with an optimizer of
/// `states_per_param` state values per parameter. `units` are the padded sizes of the units
/// (Engine::units(), padded for world_size) in the order forward runs them, the root first.
///
/// The step's schedule, as the engine runs it, and what each point adds on top of
/// resident_memory<S>(sum of units):
///   forward   the root is gathered and stays gathered until its backward is done; each other
///             unit is gathered before its forward, the next ones prefetched meanwhile (prefetch:
///             the next one, and more while stage3_prefetch_bucket_size allows: prefetch_budget_elements),
///             and freed after it (reshard_after_forward; else at its backward's end)
///   backward  units in the reverse order, each gathered again (those before it prefetched),
///             its whole gradients made (ShardGradients, ShardParameters) and, once done,
///             reduced; a unit's reduction completes when the next unit's backward is done
///             (overlap_comm; else at once), freeing its whole gradients and the copies it read
///   step      each unit's updated shard is all-gathered from a copy (whole-parameter policies
///             that shard the optimizer); under OffloadOptimizer<Nvme> the state and separate
///             masters come back from the file sub-group by sub-group (sub_group_size), as
///             many consecutive ones at most as optimizer_buffer_count has buffers for
/// Buffer by buffer (c, r: sizes of the compute and reduce dtypes; p, s: a unit's padded
/// elements and its shard):
///   parameters      a gathered unit c p; on the host under a 16-bit compute type the gathered
///                   buffer is freed once its float working copy is made
///   gradients       a unit's whole gradients 4 p (float), under WorkingCopies when the compute
///                   dtype is 16-bit
///   working copies  a gathered unit's float copy 4 p (16-bit compute)
///   communication   what a reduction reads when it is not the gradients themselves: r p, the
///                   gradients cast to a 16-bit reduce dtype; ShardOptimizerState in fp32 reduces
///                   a unit that is one bucket from a copy 4 p into a buffer r s (a unit of
///                   several buckets, in place: nothing); the all-gather after the step reads a
///                   copy c s of the rank's shard, or, cut into pieces of e elements of each
///                   shard (allgather_bucket_size: allgather_piece_elements), a piece's copy and
///                   the buffer every rank's piece lands in, c (e + N e)
///   optimizer state under NVMe offload, at most nvme_sub_groups_in_memory consecutive
///                   sub-groups' state and separate masters (an upper bound, reached when the
///                   writes lag; exact for one sub-group)
/// `buckets` are the units' gradient bucket counts (Engine::gradient_buckets(i).size()); empty:
/// one bucket a unit. `sub_groups` are the sizes of the optimizer's sub-groups, unit after unit
/// (optimizer_sub_group_sizes(Engine::optimizers())), which parameters exempt from weight decay
/// cut further; empty: each unit's shard in pieces of sub_group_size. One micro-batch per step:
/// a backward after another one of the same step, or under no_sync, carries gradients aside
/// (not predicted). HybridShard is not predicted. `shards`: the rank's shard of each unit where
/// they are uneven (UnitPlan::uneven_shards; ShardPartition::whole_parameters, whose reductions
/// to each shard's owner and broadcasts from it work in place); empty: p / N each.
template <StrategyType S>
StepPeakMemory host_step_peak_memory(std::span<const std::int64_t> units, int world_size, int states_per_param = 2,
                                     const StrategyConfig& config = {}, std::span<const std::size_t> buckets = {},
                                     std::span<const std::int64_t> sub_groups = {},
                                     std::span<const std::int64_t> shards = {}) {
  using sharding = typename S::sharding;
  using CT = typename S::compute_type;
  using RT = typename S::reduce_type;
  using MT = typename S::master_type;
  static_assert(!sharding::hybrid, "host_step_peak_memory: HybridShard's step peaks are not predicted");
  using Walk = detail::StepMemoryWalk;
  constexpr bool work16 = !std::is_same_v<CT, float>;  // the host computes on float working copies
  constexpr double c = sizeof(CT), r = sizeof(RT), w = sizeof(float);
  constexpr Walk::Category grad_category = work16 ? Walk::working_copies : Walk::gradients;
  const double n = static_cast<double>(world_size);
  const auto p = [&](std::size_t i) { return static_cast<double>(units[i]); };
  const bool uneven = !shards.empty();
  [[maybe_unused]] const auto shard = [&](std::size_t i) { return uneven ? static_cast<double>(shards[i]) : p(i) / n; };
  const std::size_t last = units.size() - 1;  // units 1..last run inside the root, in this order

  Walk walk(resident_memory<S, Cpu>(units, world_size, states_per_param, config, shards));

  // Under OffloadParameters<Nvme>, the units whose shards are in the file: each is read in for
  // its gathers and dropped once gathered, params_buffer_count of them in memory at most but for
  // a gather that needs one more; a prefetch waits for a free buffer.
  constexpr bool shards_in_file = S::offload::to_nvme && S::offload::offloads_parameters;
  std::vector<bool> in_file(units.size(), false);
  if constexpr (shards_in_file)
    for (std::size_t i = nvme_units_in_memory(units, world_size, config.max_in_cpu); i < units.size(); ++i)
      in_file[i] = true;
  const auto shard_bytes = [&](std::size_t i) { return in_file[i] ? c * p(i) / n : 0.0; };
  int shards_read = 0;  // shards in memory for gathers under way
  const auto read_shard = [&](std::size_t i) {
    walk.add(Walk::parameters, shard_bytes(i));
    if (in_file[i]) ++shards_read;
  };
  const auto drop_shard = [&](std::size_t i) {
    walk.sub(Walk::parameters, shard_bytes(i));
    if (in_file[i]) --shards_read;
  };

  // Gathering (ShardParameters only: the other policies keep every unit whole). The unit after
  // the prefetches in flight has its shard read ahead when a buffer is free (read_ahead).
  std::vector<bool> gathered(units.size(), false), prefetched(units.size(), false), read_ahead(units.size(), false);
  const auto read_shard_once = [&](std::size_t i) {
    if (!read_ahead[i]) read_shard(i);
    read_ahead[i] = false;
  };
  double ahead = 0;  // elements of the units prefetched and not yet used
  const double budget = static_cast<double>(prefetch_budget_elements(config));
  const auto finish_gather = [&](std::size_t i) {
    if (work16) {
      walk.add(Walk::working_copies, w * p(i));
      walk.sub(Walk::parameters, c * p(i));
    }
    gathered[i] = true;
  };
  const auto gather = [&](std::size_t i) {
    if (!sharding::shards_parameters || gathered[i]) return;
    if (prefetched[i]) {
      prefetched[i] = false;
      ahead -= p(i);
    } else {
      read_shard_once(i);
      walk.add(Walk::parameters, c * p(i));
    }
    finish_gather(i);
    drop_shard(i);
  };
  // Units after i (direction +1 in forward, -1 in backward) not yet gathered, while those ahead
  // fit the budget; the first one whatever its size.
  const auto prefetch_after = [&](std::size_t i, int direction) {
    if (!sharding::shards_parameters || !config.prefetch) return;
    for (auto j = static_cast<std::ptrdiff_t>(i) + direction; j >= 1 && j <= static_cast<std::ptrdiff_t>(last);
         j += direction) {
      const auto k = static_cast<std::size_t>(j);
      if (gathered[k] || prefetched[k]) continue;
      if (ahead > 0 && ahead + p(k) > budget) {
        if (in_file[k] && !read_ahead[k] && shards_read < config.params_buffer_count) {
          read_shard(k);
          read_ahead[k] = true;
        }
        return;
      }
      if (in_file[k] && !read_ahead[k] && shards_read >= config.params_buffer_count) return;
      read_shard_once(k);
      walk.add(Walk::parameters, c * p(k));
      prefetched[k] = true;
      ahead += p(k);
    }
  };
  const auto release = [&](std::size_t i) {
    if (!sharding::shards_parameters) return;
    walk.sub(work16 ? Walk::working_copies : Walk::parameters, (work16 ? w : c) * p(i));
    gathered[i] = false;
  };

  // Reductions in flight: what each frees when it completes.
  struct InFlight {
    double gradients = 0, communication = 0;
  };
  std::deque<InFlight> in_flight;
  const auto complete = [&](std::size_t keep) {
    while (in_flight.size() > keep) {
      walk.sub(grad_category, in_flight.front().gradients);
      walk.sub(Walk::communication, in_flight.front().communication);
      in_flight.pop_front();
    }
  };
  const auto begin_backward = [&](std::size_t i) {
    if (sharding::shards_gradients) walk.add(grad_category, w * p(i));
  };
  const auto post_backward = [&](std::size_t i) {
    InFlight f;
    if constexpr (sharding::shards_gradients) {
      f.gradients = w * p(i);
      if (!std::is_same_v<RT, float>) f.communication = r * p(i);
    } else if constexpr (sharding::shards_optimizer_state) {
      const bool one_bucket = (buckets.empty() || buckets[i] <= 1) && !uneven;  // uneven: reduced in place
      if (world_size > 1 && one_bucket) {
        if (!work16 && std::is_same_v<RT, float>) f.communication = w * p(i) + r * p(i) / n;
        else if (!std::is_same_v<RT, float>) f.communication = r * p(i);
      }
    }
    walk.add(Walk::communication, f.communication);
    in_flight.push_back(f);
    complete(config.overlap_comm ? 1 : 0);
    release(i);
  };

  // Forward.
  gather(0);
  for (std::size_t i = 1; i <= last; ++i) {
    gather(i);
    prefetch_after(i, +1);
    if (sharding::reshard_after_forward) release(i);
  }
  // Backward.
  begin_backward(0);
  for (std::size_t i = last; i >= 1; --i) {
    gather(i);
    prefetch_after(i, -1);
    begin_backward(i);
    post_backward(i);
  }
  post_backward(0);
  complete(0);
  // Step.
  if (sharding::shards_optimizer_state && !sharding::shards_parameters && world_size > 1 && !uneven)
    for (std::size_t i = 0; i <= last; ++i) {
      const auto piece = static_cast<double>(allgather_piece_elements(config, world_size, units[i] / world_size));
      const double held = piece == 0 ? c * p(i) / n : c * (piece + n * piece);
      walk.add(Walk::communication, held);
      walk.sub(Walk::communication, held);
    }
  if constexpr (S::offload::to_nvme) {
    // The state comes back sub-group by sub-group (sub_group_size), as many at most as
    // optimizer_buffer_count has buffers for, with the group's masters unless they are the
    // shards (the host steps where they live).
    std::vector<double> groups(sub_groups.begin(), sub_groups.end());
    if (sub_groups.empty())
      for (std::size_t i = 0; i <= last; ++i)
        for (const std::int64_t g : sub_group_sizes(static_cast<std::int64_t>(shard(i)), config.sub_group_size))
          groups.push_back(static_cast<double>(g));
    const double masters = std::is_same_v<MT, CT> ? 0.0 : 1.0;
    walk.add(Walk::optimizer_state, sizeof(MT) * (static_cast<double>(states_per_param) + masters) *
                                        detail::largest_window_sum(
                                            groups, nvme_sub_groups_in_memory(config.optimizer_buffer_count,
                                                                              states_per_param)));
  }
  if constexpr (shards_in_file) {
    // The step reads each unit's shard in (and the next one's ahead), params_buffer_count of
    // the units in the file at most: a window of that many consecutive ones.
    std::vector<double> file_shards;
    for (std::size_t i = 0; i <= last; ++i)
      if (in_file[i]) file_shards.push_back(shard_bytes(i));
    const double most = detail::largest_window_sum(file_shards, config.params_buffer_count);
    walk.add(Walk::parameters, most);
    walk.sub(Walk::parameters, most);
  }

  StepPeakMemory m;
  m.parameters = walk.peak(Walk::parameters);
  m.gradients = walk.peak(Walk::gradients);
  m.optimizer_state = walk.peak(Walk::optimizer_state);
  m.working_copies = walk.peak(Walk::working_copies);
  m.communication = walk.peak(Walk::communication);
  m.other = walk.peak(Walk::other);
  return m;
}


/// The peak bytes per category one rank holds while Engine's constructor builds it (a host
/// model under S; `units` and `states_per_param` as for host_step_peak_memory): what it holds
/// once built (resident_memory<S>) and, under NVMe offload, one unit's worth more. The engine
/// builds the units one by one and places each before the next: offloading to NVMe, it writes
/// the unit's optimizer state and separate masters (and, under OffloadParameters<Nvme>, its
/// shard, unless max_in_cpu keeps it) to the file and frees them, so that building holds the
/// largest unit's (each category's largest apart; its separate masters twice, copied into its
/// sub-groups before the unit's copy is freed), never the model's: a model whose state does
/// not fit in host memory is built, as DeepSpeed's zero.Init builds one with remote_device nvme.
/// Every other placement builds each unit where it stays: nothing more.
template <StrategyType S>
StepPeakMemory host_construction_peak_memory(std::span<const std::int64_t> units, int world_size,
                                             int states_per_param = 2, const StrategyConfig& config = {},
                                             std::span<const std::int64_t> shards = {}) {
  using CT = typename S::compute_type;
  using MT = typename S::master_type;
  const ResidentMemory built = resident_memory<S, Cpu>(units, world_size, states_per_param, config, shards);
  StepPeakMemory m;
  m.parameters = built.parameters;
  m.gradients = built.gradients;
  m.optimizer_state = built.optimizer_state;
  m.working_copies = built.working_copies;
  m.other = built.other;
  if constexpr (S::offload::to_nvme) {
    constexpr bool shards_in_file = S::offload::offloads_parameters;
    const std::size_t kept = shards_in_file ? nvme_units_in_memory(units, world_size, config.max_in_cpu) : units.size();
    // Separate masters (else they are the shards) are copied into the unit's sub-groups' own
    // before the unit's copy is freed: twice, for a while.
    const double masters = std::is_same_v<MT, CT> ? 0.0 : 2.0;
    double shard = 0, state = 0;
    for (std::size_t i = 0; i < units.size(); ++i) {
      const double elements = static_cast<double>(shards.empty() ? units[i] / world_size : shards[i]);
      if (i >= kept) shard = std::max(shard, sizeof(CT) * elements);
      state = std::max(state, sizeof(MT) * (static_cast<double>(states_per_param) + masters) * elements);
    }
    m.parameters += shard;
    m.optimizer_state += state;
  }
  return m;
}

}  // namespace polyshard
