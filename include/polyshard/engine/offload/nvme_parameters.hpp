// OffloadParameters<Nvme> (ZeRO-Infinity with DeepSpeed's offload_param and offload_optimizer on
// nvme): each unit's parameter shard, its fp32 master copy and its optimizer state live in a
// file under nvme_path between uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/core/host_allocator.hpp"
#include "polyshard/engine/offload/nvme_optimizer_state.hpp"
#include "polyshard/engine/offload/placement.hpp"
#include "polyshard/policy/accounting.hpp"
#include "polyshard/policy/config.hpp"

namespace polyshard {

#if defined(POLYSHARD_HAVE_LIBURING)

/// One file per rank, `polyshard-offload-rank<r>-pid<p>-<n>.swp` under StrategyConfig::nvme_path,
/// with two swaps in it (engine/offload/nvme_swap.hpp):
///   parameter shards  read in for each gather of their unit (forward, and backward again; the
///                     unit after the prefetched ones read ahead, as read_parameters_ahead) and
///                     dropped once the gather has read them; brought in for the unit's optimizer
///                     step and written back after it. At most params_buffer_count units' shards
///                     are in memory at once, each at most params_buffer_size elements (a larger
///                     one is refused when the engine is built). The first units, in unit order,
///                     whose shards add up to at most max_in_cpu elements stay in host memory
///                     instead, read by nothing but their gathers, as under OffloadParameters<Cpu>.
///   optimizer state   with the separate master copy of the weights (mixed precision; in fp32 the
///                     masters are the shards themselves), as OffloadOptimizer<Nvme> keeps them:
///                     in memory from the read before a sub-group's step (sub_group_size) to the
///                     end of the write after it, as many sub-groups as optimizer_buffer_count has
///                     buffers for (nvme_sub_groups_in_memory) at most.
/// So host memory holds, between steps, the shards max_in_cpu keeps and the file's staging
/// buffers; during forward and backward, params_buffer_count shards more at most; during the
/// step, as many shards and those sub-groups' state and masters; while the engine is built, one
/// unit's shard, state and masters more, each unit written to the file as soon as it is built.
template <class Offload>
  requires(Offload::to_nvme && Offload::offloads_parameters)
class OffloadPlacement<Offload> {
 public:
  static constexpr const char* optimizer_state = "nvme";
  static constexpr const char* parameters = "nvme";

  /// Called for each unit in turn as soon as it and its optimizer (optimizers[unit]) are built:
  /// lays its parameter shard (unless max_in_cpu keeps it), master copy and optimizer state out
  /// in the rank's file under config.nvme_path (created for unit 0), writes them there and frees
  /// them, so that building the engine holds one unit's at most beyond what max_in_cpu keeps
  /// (as DeepSpeed's zero.Init with remote_device nvme builds a model larger than host memory).
  /// Throws polyshard::Error naming the option when nvme_path, block_size, queue_depth,
  /// optimizer_buffer_count, params_buffer_count, params_buffer_size or max_in_cpu is unusable.
  template <class State, class Groups>
  void place(std::size_t unit, std::vector<State>& units, std::vector<Groups>& optimizers,
             const StrategyConfig& config, int rank) {
    if (unit == 0) {
      POLYSHARD_CHECK(config.params_buffer_count >= 1, "OffloadParameters<Nvme>: params_buffer_count (units whose ",
                      "parameter shards may be in memory at once) must be at least 1, got ",
                      config.params_buffer_count);
      POLYSHARD_CHECK(config.max_in_cpu >= 0, "OffloadParameters<Nvme>: max_in_cpu (parameter elements kept in ",
                      "host memory) must not be negative, got ", config.max_in_cpu);
      params_ = NvmeSwap("parameter shard", config.params_buffer_count);
      state_ = NvmeSwap("optimizer state", detail::sub_groups_in_memory(optimizers, config));
      std::vector<std::int64_t> padded;
      for (const State& u : units) padded.push_back(u.layout->padded);
      in_memory_ = nvme_units_in_memory(padded, units[0].world, config.max_in_cpu);
      detail::create_nvme_file(at_.file, config, "polyshard-offload-rank" + std::to_string(rank), 0);
    }
    const State& u = units[unit];
    const std::int64_t n = u.param_shard.numel();
    POLYSHARD_CHECK(n <= config.params_buffer_size, "OffloadParameters<Nvme>: the parameter shard of ",
                    u.layout->display_name(), " has ", n, " elements, more than params_buffer_size (",
                    config.params_buffer_size, "), what one of the params_buffer_count buffers holds: raise ",
                    "params_buffer_size, or wrap the model in smaller units");
    if (unit < in_memory_) at_.seen.push_back(u.param_shard.storage().get());  // nor with the state, as a master
    else params_.add(unit, u.param_shard.storage(), at_.end, at_.seen);
    at_.file->extend(at_.end);
    params_.place(unit, *at_.file);
    at_.add_and_place_sub_groups(state_, units[unit], optimizers[unit]);
  }
  /// Every unit placed.
  void finish_placing() {
    at_.finish();
    // The freed blocks would stay cached in host memory, which offloading is meant to free.
    CachingHostAllocator::instance().release_cached();
  }

  /// Unit `unit`'s parameter shard in memory, and the next unit's on its way.
  void fetch(std::size_t unit) { params_.acquire_and_read_ahead(unit, unit + 1); }
  /// Sub-group `k` of unit `unit`: its state and masters in memory, and the next sub-group's on its way.
  void fetch_group(std::size_t unit, std::size_t k) {
    const std::size_t g = at_.first_group[unit] + k;
    state_.acquire_and_read_ahead(g, g + 1);
  }
  /// Starts writing sub-group `k` of unit `unit` back.
  void store_group(std::size_t unit, std::size_t k) { state_.store(at_.first_group[unit] + k); }
  /// Starts writing unit `unit`'s updated shard back.
  void store(std::size_t unit) { params_.store(unit); }
  /// Waits for every read and write and frees what they moved; throws the first I/O failure.
  void settle() { detail::settle_all({&params_, &state_}); }

  /// Calls fn() with unit `unit`'s shard and the state and masters of every sub-group of it in
  /// memory, then writes them back and frees them. If fn throws, the file stays as it was.
  template <class F>
  std::invoke_result_t<F&> with_resident(std::size_t unit, F&& fn) {
    return detail::with_entries_resident(
        {{&params_, unit, unit + 1}, {&state_, at_.first_group[unit], at_.first_group[unit + 1]}}, fn);
  }

  /// fn() with unit `unit`'s master weights (in its sub-groups) and parameter shard in memory,
  /// then written back (a refresh of the shard from the masters).
  template <class F>
  std::invoke_result_t<F&> with_masters(std::size_t unit, F&& fn) {
    return with_resident(unit, std::forward<F>(fn));
  }

  /// Unit `unit`'s parameter shard in memory for a gather, until release_parameters(unit).
  void acquire_parameters(std::size_t unit) { params_.acquire(unit); }
  /// The gather has read the shard: its memory is freed (the file holds the same values).
  void release_parameters(std::size_t unit) { params_.drop(unit); }
  /// Starts reading unit `unit`'s shard in for a gather to come, when it is in the file and a
  /// buffer is free now; acquire_parameters then waits for the read, if it has not arrived.
  void read_parameters_ahead(std::size_t unit) { params_.read_ahead(unit); }
  /// Whether a prefetch may read unit `unit`'s shard now: it needs no buffer, has one already (read
  /// ahead), or one is free.
  bool may_read_parameters_ahead(std::size_t unit) const {
    return !params_.holds(unit) || params_.in_memory(unit) || params_.has_room();
  }

  /// fn() with unit `unit`'s parameter shard in memory, for reading; freed after.
  template <class F>
  std::invoke_result_t<F&> with_parameters(std::size_t unit, F&& fn) {
    acquire_parameters(unit);
    return detail::then_put_back(fn, [&] { release_parameters(unit); }, [&] { params_.settle_quietly(); });
  }

  /// Whether unit `unit`'s parameter shard lives in the file (not kept in memory by max_in_cpu).
  bool parameters_in_file(std::size_t unit) const { return params_.holds(unit); }
  /// The file, for tests and diagnostics (empty before place()).
  const std::optional<UringFile>& file() const { return at_.file; }

 private:
  NvmeSwap params_, state_;
  std::size_t in_memory_ = 0;    // the first units, whose shards max_in_cpu keeps in host memory
  detail::NvmeLayoutCursor at_;  // after the swaps: its file is destroyed first, finishing I/O into the storages
};

#else

template <class Offload>
  requires(Offload::to_nvme && Offload::offloads_parameters)
struct OffloadPlacement<Offload> {
  static_assert(sizeof(Offload) == 0,
                "OffloadParameters<Nvme> (ZeRO-Infinity) needs liburing, which this build did not find: install it "
                "(Debian: liburing-dev) and configure again");
};

#endif

}  // namespace polyshard
