// OffloadOptimizer<Nvme> (ZeRO-Infinity's offload_optimizer with device nvme): every unit's
// optimizer state, and its master weights where they are a copy of their own (mixed precision, or
// a device model's host masters), live in a file under nvme_path between steps. The step reads
// them back unit by unit, reading the next unit's while one unit steps and writing each back
// behind it.
#pragma once

#include <cstddef>
#include <cstdint>
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

/// Lays out, in `swap`, every optimizer's state tensors (exp_avg and exp_avg_sq for Adam) as
/// unit i's.
template <class Opt>
void add_optimizer_state(NvmeSwap& swap, std::vector<Opt>& optimizers, std::int64_t& end,
                         std::vector<const void*>& seen) {
  for (std::size_t i = 0; i < optimizers.size(); ++i)
    for (const auto& [name, tensor] : optimizers[i].state()) swap.add(i, tensor.storage(), end, seen);
}

inline void check_optimizer_buffer_count(const StrategyConfig& config, const char* policy) {
  POLYSHARD_CHECK(config.optimizer_buffer_count >= 1, policy, ": optimizer_buffer_count (units whose ",
                  "optimizer state may be in memory at once) must be at least 1, got ", config.optimizer_buffer_count);
}
}  // namespace detail

/// One file per rank, `polyshard-optimizer-state-rank<r>-pid<p>-<n>.swp` under
/// StrategyConfig::nvme_path, holding every unit's state tensors (exp_avg and exp_avg_sq for
/// Adam) and, where the masters are not the parameter shards themselves, its fp32 master
/// weights, one after the other, each at an offset aligned for O_DIRECT (as DeepSpeed's
/// offload_optimizer nvme keeps the fp32 partitions with the moments). A unit's state is in
/// memory only from the read before its optimizer step to the end of the write after it, and
/// at most optimizer_buffer_count units' state is in memory at once. Between steps none is: the
/// optimizers' state() tensors and the separate masters then have no elements, and
/// access_optimizer (or with_masters) brings one unit's back. The parameter shards stay in memory.
template <class Offload>
  requires(Offload::to_nvme && !Offload::offloads_parameters)
class OffloadPlacement<Offload> : public ParametersInMemory {
 public:
  static constexpr const char* optimizer_state = "nvme";
  static constexpr const char* parameters = "host";

  /// Lays the state of `optimizers` (one per unit) out in a new file under config.nvme_path,
  /// writes it there as the optimizers built it, and frees it. Throws polyshard::Error naming
  /// the option when nvme_path, block_size, queue_depth or optimizer_buffer_count is unusable.
  template <class State, class Opt>
  void place(std::vector<State>& units, std::vector<Opt>& optimizers, const StrategyConfig& config, int rank) {
    detail::check_optimizer_buffer_count(config, "OffloadOptimizer<Nvme>");
    state_ = NvmeSwap("optimizer state", optimizers.size(), config.optimizer_buffer_count);
    std::int64_t end = 0;
    std::vector<const void*> seen;
    detail::add_optimizer_state(state_, optimizers, end, seen);
    // Masters that are the parameter shards stay: the gathers read them.
    if constexpr (!State::master_is_shard)
      for (std::size_t i = 0; i < units.size(); ++i) state_.add(i, units[i].master.storage(), end, seen);
    detail::create_nvme_file(file_, config, "polyshard-optimizer-state-rank" + std::to_string(rank), end);
    state_.place(*file_);
    // The freed blocks would stay cached in host memory, which offloading is meant to free.
    CachingHostAllocator::instance().release_cached();
  }

  /// Unit `unit`'s state in memory, and the next unit's read started when a buffer is free.
  void fetch(std::size_t unit) { state_.acquire_and_read_ahead(unit, unit + 1); }
  /// Starts writing unit `unit`'s state back; its memory is freed once the write is done.
  void store(std::size_t unit) { state_.store(unit); }
  /// Waits for every read and write and frees every unit's state; throws the first I/O failure.
  void settle() { state_.settle(); }

  /// Calls fn() with unit `unit`'s state in memory, then writes it back and frees it. If fn
  /// throws, the state in the file stays as it was.
  template <class F>
  std::invoke_result_t<F&> with_resident(std::size_t unit, F&& fn) {
    state_.acquire(unit);
    return detail::then_put_back(
        fn,
        [&] {
          store(unit);
          settle();
        },
        [&] { state_.settle_quietly(); });
  }

  /// fn() with unit `unit`'s master weights in memory, written back after (a refresh of the
  /// parameter shard from the masters after a checkpoint restore).
  template <class F>
  std::invoke_result_t<F&> with_masters(std::size_t unit, F&& fn) {
    return with_resident(unit, std::forward<F>(fn));
  }

  /// The file, for tests and diagnostics (empty before place()).
  const std::optional<UringFile>& file() const { return file_; }

 private:
  NvmeSwap state_;
  std::optional<UringFile> file_;  // last: destroyed first, finishing I/O into the storages
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
