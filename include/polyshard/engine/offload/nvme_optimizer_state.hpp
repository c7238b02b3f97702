// OffloadOptimizer<Nvme> (ZeRO-Infinity's offload_optimizer with device nvme): every unit's
// optimizer state, and its master weights where they are a copy of their own (mixed precision, or
// a device model's host masters), live in a file under nvme_path between steps. The step reads
// them back sub-group by sub-group (sub_group_size), reading the next one while one steps and
// writing each back behind it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/core/host_allocator.hpp"
#include "polyshard/engine/offload/placement.hpp"
#include "polyshard/policy/config.hpp"

#if defined(POLYSHARD_HAVE_LIBURING)
#include "polyshard/core/uring_file.hpp"
#include "polyshard/engine/offload/nvme_swap.hpp"
#endif

namespace polyshard {

#if defined(POLYSHARD_HAVE_LIBURING)

namespace detail {
/// Creates in `file` the rank's swap file under config.nvme_path, `bytes` long, with the aio
/// settings of `config`.
inline void create_nvme_file(std::optional<UringFile>& file, const StrategyConfig& config, const std::string& stem,
                             std::int64_t bytes) {
  file.emplace(config.nvme_path, stem, bytes,
               UringFileOptions{.block_size = config.block_size,
                                .queue_depth = config.queue_depth,
                                .pin_memory = config.pin_memory});
}

/// Lays out, in `swap`, one swap unit per sub-group of `groups` (unit `unit`'s optimizer),
/// numbered from `first`: the group's state tensors (exp_avg and exp_avg_sq for Adam) and, where
/// the unit's master weights are a copy of their own (mixed precision, a device model's host
/// masters), the group's share of them, which the group holds from then on
/// (OptimizerGroups::hold_masters_apart). Returns how many sub-groups it laid out.
template <class State, class Groups>
std::size_t add_sub_groups(NvmeSwap& swap, State& unit, Groups& groups, std::size_t first, std::int64_t& end,
                           std::vector<const void*>& seen) {
  if constexpr (!State::master_is_shard && !State::master_is_full) groups.hold_masters_apart(unit.master);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    if (groups.hold_masters()) swap.add(first + k, groups.master(k).storage(), end, seen);
    for (const auto& [name, tensor] : groups[k].state()) swap.add(first + k, tensor.storage(), end, seen);
  }
  return groups.size();
}

/// What a placement in a file carries while the engine hands it the units one by one: the file,
/// where the next storage goes in it, the storages laid out (none twice), and where each unit's
/// sub-groups start.
struct NvmeLayoutCursor {
  std::optional<UringFile> file;  // placements declare the cursor after their swaps: its I/O ends first
  std::int64_t end = 0;
  std::vector<const void*> seen;
  std::vector<std::size_t> first_group{0};  // unit i's sub-groups are [first_group[i], first_group[i + 1])

  /// Lays out unit `unit`'s sub-groups in `swap` after those of the units before it, extends
  /// the file to hold them, and writes them there (after what the caller laid out before).
  template <class State, class Groups>
  void add_and_place_sub_groups(NvmeSwap& swap, State& unit, Groups& groups) {
    const std::size_t first = first_group.back();
    first_group.push_back(first + add_sub_groups(swap, unit, groups, first, end, seen));
    file->extend(end);
    for (std::size_t g = first; g < first_group.back(); ++g) swap.place(g, *file);
  }
  /// Every unit placed: the storages' identities are no longer needed.
  void finish() { seen = {}; }
};

/// Entries [first, last) of `swap`.
struct SwapEntries {
  NvmeSwap* swap;
  std::size_t first, last;
};

/// fn() with the given entries of each swap in memory, then each written back and every swap
/// settled. If bringing them in or fn throws, what came in is freed unwritten: the file keeps
/// what it had.
template <class F>
std::invoke_result_t<F&> with_entries_resident(std::initializer_list<SwapEntries> entries, F& fn) {
  const auto abandon = [&] {
    for (const SwapEntries& e : entries) e.swap->settle_quietly();
  };
  try {
    for (const SwapEntries& e : entries)
      for (std::size_t i = e.first; i < e.last; ++i) e.swap->acquire(i);
  } catch (...) {
    abandon();
    throw;
  }
  return then_put_back(
      fn,
      [&] {
        std::vector<NvmeSwap*> swaps;
        for (const SwapEntries& e : entries) {
          for (std::size_t i = e.first; i < e.last; ++i) e.swap->store(i);
          swaps.push_back(e.swap);
        }
        settle_all(swaps);
      },
      abandon);
}

/// How many sub-groups' state optimizer_buffer_count lets a step hold in memory at once.
template <class Groups>
int sub_groups_in_memory(const std::vector<Groups>& optimizers, const StrategyConfig& config) {
  const std::size_t states = optimizers.empty() ? 0 : optimizers.front().most_state_kinds();
  return nvme_sub_groups_in_memory(config.optimizer_buffer_count, static_cast<int>(states));
}
}  // namespace detail

/// One file per rank, `polyshard-optimizer-state-rank<r>-pid<p>-<n>.swp` under
/// StrategyConfig::nvme_path, holding every sub-group's state tensors (exp_avg and exp_avg_sq
/// for Adam) and, where the masters are not the parameter shards themselves, its fp32 master
/// weights, one after the other, each at an offset aligned for O_DIRECT (as DeepSpeed's
/// offload_optimizer nvme keeps the fp32 partitions with the moments). A sub-group's state and
/// masters are in memory only from the read before its step to the end of the write after it,
/// and at most the sub-groups optimizer_buffer_count has buffers for (nvme_sub_groups_in_memory)
/// are in memory at once. Between steps none is: the optimizers' state() tensors and the
/// separate masters then have no elements, and access_optimizer (or with_masters) brings one
/// unit's back. The parameter shards stay in memory.
template <class Offload>
  requires(Offload::to_nvme && !Offload::offloads_parameters)
class OffloadPlacement<Offload> : public ParametersInMemory {
 public:
  static constexpr const char* optimizer_state = "nvme";
  static constexpr const char* parameters = "host";

  /// Called for each unit in turn as soon as it and its optimizer (optimizers[unit]) are built:
  /// lays the optimizer's state out in the rank's file under config.nvme_path (created for unit
  /// 0), writes it there as the optimizer built it, and frees it, so that building the engine
  /// holds one unit's state at most. Throws polyshard::Error naming the option when nvme_path,
  /// block_size, queue_depth or optimizer_buffer_count is unusable.
  template <class State, class Groups>
  void place(std::size_t unit, std::vector<State>& units, std::vector<Groups>& optimizers,
             const StrategyConfig& config, int rank) {
    if (unit == 0) {
      state_ = NvmeSwap("optimizer state", detail::sub_groups_in_memory(optimizers, config));
      detail::create_nvme_file(at_.file, config, "polyshard-optimizer-state-rank" + std::to_string(rank), 0);
    }
    // Masters that are the parameter shards stay: the gathers read them.
    at_.add_and_place_sub_groups(state_, units[unit], optimizers[unit]);
  }
  /// Every unit placed.
  void finish_placing() {
    at_.finish();
    // The freed blocks would stay cached in host memory, which offloading is meant to free.
    CachingHostAllocator::instance().release_cached();
  }

  void fetch(std::size_t) {}
  /// Sub-group `k` of unit `unit`: its state and masters in memory, and the next sub-group's
  /// read started when a buffer is free.
  void fetch_group(std::size_t unit, std::size_t k) {
    const std::size_t g = at_.first_group[unit] + k;
    state_.acquire_and_read_ahead(g, g + 1);
  }
  /// Starts writing sub-group `k` of unit `unit` back; its memory is freed once the write is done.
  void store_group(std::size_t unit, std::size_t k) { state_.store(at_.first_group[unit] + k); }
  void store(std::size_t) {}
  /// Waits for every read and write and frees all state and masters; throws the first I/O failure.
  void settle() { state_.settle(); }

  /// Calls fn() with the state and masters of every sub-group of unit `unit` in memory, then
  /// writes them back and frees them. If fn throws, the file stays as it was.
  template <class F>
  std::invoke_result_t<F&> with_resident(std::size_t unit, F&& fn) {
    return detail::with_entries_resident({{&state_, at_.first_group[unit], at_.first_group[unit + 1]}}, fn);
  }

  /// fn() with unit `unit`'s master weights in memory (in its sub-groups), written back after (a
  /// refresh of the parameter shard from the masters after a checkpoint restore).
  template <class F>
  std::invoke_result_t<F&> with_masters(std::size_t unit, F&& fn) {
    return with_resident(unit, std::forward<F>(fn));
  }

  /// The file, for tests and diagnostics (empty before place()).
  const std::optional<UringFile>& file() const { return at_.file; }

 private:
  NvmeSwap state_;
  detail::NvmeLayoutCursor at_;  // after the swap: its file is destroyed first, finishing I/O into the storages
};

#else

template <class Offload>
  requires(Offload::to_nvme && !Offload::offloads_parameters)
struct OffloadPlacement<Offload> {
  static_assert(sizeof(Offload) == 0,
                "OffloadOptimizer<Nvme> (ZeRO-Infinity) needs liburing, which this build did not find: install it "
                "(Debian: liburing-dev) and configure again; polyshard's CMake target then defines "
                "POLYSHARD_HAVE_LIBURING and links liburing");
};

#endif

}  // namespace polyshard
