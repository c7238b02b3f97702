// OffloadOptimizer<Nvme> (ZeRO-Infinity's offload_optimizer with device nvme): every unit's
// optimizer state lives in a file under nvme_path between steps. The step reads it back unit by
// unit, reading the next unit's state while one unit steps and writing each back behind it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/core/host_allocator.hpp"
#include "polyshard/engine/offload/placement.hpp"
#include "polyshard/policy/config.hpp"
#include "polyshard/tensor/tensor.hpp"

#if defined(POLYSHARD_HAVE_LIBURING)
#include "polyshard/core/uring_file.hpp"
#endif

namespace polyshard {

#if defined(POLYSHARD_HAVE_LIBURING)

namespace detail {
/// The storage of one optimizer state tensor, whatever its element type, and where it goes in
/// the file. It keeps the storage alive: the optimizer's tensors share it.
class SwappedStorage {
 public:
  template <class P>
  SwappedStorage(std::shared_ptr<Storage<P, Cpu>> storage, std::int64_t offset)
      : storage_(storage),
        bytes_(storage->bytes()),
        offset_(offset),
        materialize_([](void* s) { static_cast<Storage<P, Cpu>*>(s)->materialize(); }),
        release_([](void* s) { static_cast<Storage<P, Cpu>*>(s)->release(); }),
        data_([](void* s) { return reinterpret_cast<std::byte*>(static_cast<Storage<P, Cpu>*>(s)->data()); }) {}

  /// Allocates the elements again (their values come from the file).
  std::span<std::byte> materialize() {
    materialize_(storage_.get());
    return bytes();
  }
  std::span<std::byte> bytes() const { return {data_(storage_.get()), bytes_}; }
  void release() { release_(storage_.get()); }
  std::int64_t offset() const { return offset_; }
  std::size_t size() const { return bytes_; }

 private:
  std::shared_ptr<void> storage_;
  std::size_t bytes_;
  std::int64_t offset_;  // in the file, a multiple of UringFile::alignment
  void (*materialize_)(void*);
  void (*release_)(void*);
  std::byte* (*data_)(void*);
};
}  // namespace detail

/// One file per rank, `polyshard-optimizer-state-rank<r>-pid<p>-<n>.swp` under
/// StrategyConfig::nvme_path, holding every unit's state tensors (exp_avg and exp_avg_sq for
/// Adam) one after the other, each at an offset aligned for O_DIRECT. A unit's state is in
/// memory only from the read before its optimizer step to the end of the write after it, and
/// at most optimizer_buffer_count units' state is in memory at once. Between steps none is: the
/// optimizers' state() tensors then have no elements, and access_optimizer brings one unit's
/// back. A separate master copy of the weights (mixed precision) stays in memory.
template <class Offload>
  requires(Offload::to_nvme && !Offload::offloads_parameters)
class OffloadPlacement<Offload> {
 public:
  static constexpr const char* optimizer_state = "nvme";
  static constexpr const char* parameters = "host";

  /// Lays the state of `optimizers` (one per unit) out in a new file under config.nvme_path,
  /// writes it there as the optimizers built it, and frees it. Throws polyshard::Error naming
  /// the option when nvme_path, block_size, queue_depth or optimizer_buffer_count is unusable.
  template <class Opt>
  void place(std::vector<Opt>& optimizers, const StrategyConfig& config, int rank) {
    POLYSHARD_CHECK(config.optimizer_buffer_count >= 1, "OffloadOptimizer<Nvme>: optimizer_buffer_count (units whose ",
                    "optimizer state may be in memory at once) must be at least 1, got ", config.optimizer_buffer_count);
    buffer_count_ = config.optimizer_buffer_count;
    units_.assign(optimizers.size(), UnitSwap{});
    std::vector<const void*> seen;
    std::int64_t end = 0;
    for (std::size_t i = 0; i < optimizers.size(); ++i) {
      for (const auto& [name, tensor] : optimizers[i].state()) {
        const auto& storage = tensor.storage();
        if (!storage || storage->bytes() == 0 || std::find(seen.begin(), seen.end(), storage.get()) != seen.end())
          continue;
        seen.push_back(storage.get());
        units_[i].storages.emplace_back(storage, end);
        end += UringFile::round_up(static_cast<std::int64_t>(storage->bytes()));
      }
    }
    file_.emplace(config.nvme_path, "polyshard-optimizer-state-rank" + std::to_string(rank), end,
                  UringFileOptions{.block_size = config.block_size,
                                   .queue_depth = config.queue_depth,
                                   .pin_memory = config.pin_memory});
    for (std::size_t i = 0; i < units_.size(); ++i) {
      if (units_[i].storages.empty()) continue;
      units_[i].where = Where::resident;
      ++resident_;
      store(i);
    }
    settle();
    // The freed blocks would stay cached in host memory, which offloading is meant to free.
    CachingHostAllocator::instance().release_cached();
  }

  /// Unit `unit`'s state in memory (read, or waited for if a read is under way), and the next
  /// unit's read started when a buffer is free or a finished write-back frees one.
  void fetch(std::size_t unit) {
    retire_finished_writes();
    make_resident(unit);
    const std::size_t next = unit + 1;
    if (next < units_.size() && units_[next].where == Where::file && !units_[next].storages.empty() && make_room())
      start_read(next);
  }

  /// Starts writing unit `unit`'s state back; its memory is freed once the write is done.
  void store(std::size_t unit) {
    UnitSwap& u = units_[unit];
    if (u.storages.empty()) return;
    POLYSHARD_CHECK(u.where == Where::resident, "OffloadOptimizer<Nvme>: unit ", unit,
                    "'s optimizer state is stored back without having been fetched");
    for (detail::SwappedStorage& s : u.storages) u.tickets.push_back(file_->write(s.bytes(), s.offset()));
    u.where = Where::writing;
    writing_.push_back(unit);
  }

  /// Waits for every read and write and frees every unit's state. A unit fetched but never
  /// stored (a step or an access that threw) is freed unwritten: the file keeps its state as
  /// it was. Throws the first I/O failure once everything is freed.
  void settle() {
    std::exception_ptr first;
    for (UnitSwap& u : units_) {
      if (u.where == Where::file) continue;
      try {
        wait(u);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      release(u);
    }
    writing_.clear();
    if (first) std::rethrow_exception(first);
  }

  /// Calls fn() with unit `unit`'s state in memory, then writes it back and frees it. If fn
  /// throws, the state in the file stays as it was.
  template <class F>
  std::invoke_result_t<F&> with_resident(std::size_t unit, F&& fn) {
    using R = std::invoke_result_t<F&>;
    make_resident(unit);
    try {
      if constexpr (std::is_void_v<R>) {
        fn();
        store(unit);
        settle();
      } else {
        R result = fn();
        store(unit);
        settle();
        return std::forward<R>(result);
      }
    } catch (...) {
      settle_quietly();
      throw;
    }
  }

  /// The file, for tests and diagnostics (empty before place()).
  const std::optional<UringFile>& file() const { return file_; }

 private:
  enum class Where : std::uint8_t { file, reading, resident, writing };
  struct UnitSwap {
    std::vector<detail::SwappedStorage> storages;
    std::vector<UringFile::Ticket> tickets;  // the reads or writes under way
    Where where = Where::file;
  };

  void make_resident(std::size_t unit) {
    UnitSwap& u = units_[unit];
    if (u.storages.empty() || u.where == Where::resident) return;
    if (u.where == Where::file) {
      make_room();  // false only when every buffer holds a resident unit: then one more
      start_read(unit);
    }
    if (u.where == Where::writing) writing_.erase(std::find(writing_.begin(), writing_.end(), unit));
    const bool was_reading = u.where == Where::reading;
    try {
      wait(u);
    } catch (...) {
      if (was_reading) release(u);  // what arrived is not the state
      throw;
    }
    u.where = Where::resident;  // a unit still being written holds its latest state in memory
  }

  void start_read(std::size_t unit) {
    UnitSwap& u = units_[unit];
    u.where = Where::reading;
    ++resident_;
    try {
      for (detail::SwappedStorage& s : u.storages) u.tickets.push_back(file_->read(s.materialize(), s.offset()));
    } catch (...) {
      settle_one_quietly(u);
      throw;
    }
  }

  /// Frees written-back units until fewer than optimizer_buffer_count are in memory, waiting
  /// for the oldest write when none has finished. False when no write is left to wait for.
  bool make_room() {
    while (resident_ >= buffer_count_) {
      if (writing_.empty()) return false;
      retire(writing_.front());
    }
    return true;
  }

  void retire_finished_writes() {
    while (!writing_.empty()) {
      UnitSwap& u = units_[writing_.front()];
      if (!std::all_of(u.tickets.begin(), u.tickets.end(), [&](UringFile::Ticket t) { return file_->ready(t); })) return;
      retire(writing_.front());
    }
  }

  /// A written-back unit's memory freed; throws if its write failed.
  void retire(std::size_t unit) {
    writing_.erase(std::find(writing_.begin(), writing_.end(), unit));
    UnitSwap& u = units_[unit];
    try {
      wait(u);
    } catch (...) {
      release(u);
      throw;
    }
    release(u);
  }

  /// Waits for every ticket of `u`, then throws the first failure.
  void wait(UnitSwap& u) {
    std::exception_ptr first;
    for (UringFile::Ticket t : u.tickets) {
      try {
        file_->wait(t);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    u.tickets.clear();
    if (first) std::rethrow_exception(first);
  }

  void release(UnitSwap& u) {
    for (detail::SwappedStorage& s : u.storages) s.release();
    if (u.where != Where::file) --resident_;
    u.where = Where::file;
  }

  void settle_one_quietly(UnitSwap& u) {
    try {
      wait(u);
    } catch (...) {
    }
    release(u);
  }

  void settle_quietly() {
    for (UnitSwap& u : units_)
      if (u.where != Where::file) settle_one_quietly(u);
    writing_.clear();
  }

  std::vector<UnitSwap> units_;
  std::deque<std::size_t> writing_;  // units whose write-back is under way, oldest first
  int resident_ = 0;                 // units whose state has memory (reading, resident, writing)
  int buffer_count_ = 1;
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
