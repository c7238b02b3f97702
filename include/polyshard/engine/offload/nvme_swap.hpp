// NvmeSwap: host storages grouped by unit, kept in a file between uses and brought back into
// memory unit by unit, at most a given number of units at once. ZeRO-Infinity's placements
// (engine/offload/nvme_*.hpp) keep optimizer state and parameter shards in one.
#pragma once

#if !defined(POLYSHARD_HAVE_LIBURING)
#error "polyshard/engine/offload/nvme_swap.hpp needs liburing (Debian: liburing-dev)"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/core/uring_file.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

namespace detail {
/// The storage of one tensor, whatever its element type, and where it goes in the file. It
/// keeps the storage alive: the engine's tensors share it.
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
  const void* identity() const { return storage_.get(); }

 private:
  std::shared_ptr<void> storage_;
  std::size_t bytes_;
  std::int64_t offset_;  // in the file, a multiple of UringFile::alignment
  void (*materialize_)(void*);
  void (*release_)(void*);
  std::byte* (*data_)(void*);
};
}  // namespace detail

/// The storages of each unit (a unit's optimizer state, or its parameter shard), each at its
/// own aligned offset of a file several swaps may share. A unit's storages have elements only
/// from the read that brings them back to the end of the write (or the drop) that follows, and
/// at most `buffers` units have them at once, but for one unit made resident while every
/// buffer holds a unit in use. `what` names the contents in errors ("optimizer state").
class NvmeSwap {
 public:
  NvmeSwap() = default;
  /// `buffers` units at most in memory at once; units are numbered from 0 as add() names them.
  NvmeSwap(std::string what, int buffers) : what_(std::move(what)), buffers_(buffers) {}

  /// Lays `storage` out at offset `end` for unit `unit` and moves `end` past it. An empty
  /// storage, or one already laid out by this swap or another that shares `seen`, is skipped.
  template <class P>
  void add(std::size_t unit, const std::shared_ptr<Storage<P, Cpu>>& storage, std::int64_t& end,
           std::vector<const void*>& seen) {
    if (unit >= units_.size()) units_.resize(unit + 1);
    if (!storage || storage->bytes() == 0 || std::find(seen.begin(), seen.end(), storage.get()) != seen.end()) return;
    seen.push_back(storage.get());
    units_[unit].storages.emplace_back(storage, end);
    end += UringFile::round_up(static_cast<std::int64_t>(storage->bytes()));
  }

  /// Whether unit `unit` has anything in the file.
  bool holds(std::size_t unit) const { return !units_[unit].storages.empty(); }
  /// Whether unit `unit`'s storages have elements now (being read, in use, or being written back).
  bool in_memory(std::size_t unit) const { return units_[unit].where != Where::file; }
  /// Whether another unit may be read in without waiting for a buffer.
  bool has_room() const { return resident_ < buffers_; }
  /// Units whose storages have elements now (being read, in use, or being written back).
  int resident() const { return resident_; }

  /// Writes unit `unit`'s storages, as they are, to `file` (which outlives this swap, and is
  /// long enough for them: UringFile::extend), waits for the write and frees them. Every unit is
  /// placed, in order, as it is made (add() first), so that making them all never holds more
  /// than one.
  void place(std::size_t unit, UringFile& file) {
    file_ = &file;
    if (unit >= units_.size()) units_.resize(unit + 1);  // a unit with nothing to keep in the file
    if (units_[unit].storages.empty()) return;
    units_[unit].where = Where::resident;
    ++resident_;
    store(unit);
    retire(unit);
  }

  /// Unit `unit`'s storages in memory (read, or waited for if a read is under way).
  void acquire(std::size_t unit) {
    retire_finished_writes();
    make_resident(unit);
  }

  /// acquire(unit), and the read of unit `next` started when a buffer is free or a finished
  /// write-back frees one.
  void acquire_and_read_ahead(std::size_t unit, std::size_t next) {
    acquire(unit);
    if (only_in_file(next) && make_room()) start_read(next);
  }

  /// Starts reading unit `unit`'s storages in when they are in the file and a buffer is free now
  /// (a finished write-back frees one), waiting for nothing: a read ahead of the acquire that
  /// will need them. Otherwise nothing.
  void read_ahead(std::size_t unit) {
    if (!only_in_file(unit)) return;
    retire_finished_writes();
    if (has_room()) start_read(unit);
  }

  /// Starts writing unit `unit`'s storages back; their memory is freed once the write is done.
  void store(std::size_t unit) {
    UnitSwap& u = units_[unit];
    if (u.storages.empty()) return;
    POLYSHARD_CHECK(u.where == Where::resident, "NVMe offload: unit ", unit, "'s ", what_,
                    " is stored back without having been brought into memory");
    for (detail::SwappedStorage& s : u.storages) u.tickets.push_back(file_->write(s.bytes(), s.offset()));
    u.where = Where::writing;
    writing_.push_back(unit);
  }

  /// Frees unit `unit`'s storages without writing them (their values are the file's): after a
  /// read-only use. A write-back under way is waited for first.
  void drop(std::size_t unit) {
    UnitSwap& u = units_[unit];
    if (u.storages.empty() || u.where == Where::file) return;
    if (u.where == Where::writing) writing_.erase(std::find(writing_.begin(), writing_.end(), unit));
    wait_then_release(u);
  }

  /// Waits for every read and write and frees every unit's storages. A unit brought in but
  /// never stored (a step or an access that threw) is freed unwritten: the file keeps its
  /// values as they were. Throws the first I/O failure once everything is freed.
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

  /// settle() without throwing: on the way out of an error.
  void settle_quietly() {
    for (UnitSwap& u : units_)
      if (u.where != Where::file) settle_one_quietly(u);
    writing_.clear();
  }

 private:
  enum class Where : std::uint8_t { file, reading, resident, writing };
  struct UnitSwap {
    std::vector<detail::SwappedStorage> storages;
    std::vector<UringFile::Ticket> tickets;  // the reads or writes under way
    Where where = Where::file;
  };

  /// Whether `unit` is a unit whose storages are in the file and not in memory: one a read would bring in.
  bool only_in_file(std::size_t unit) const {
    return unit < units_.size() && units_[unit].where == Where::file && holds(unit);
  }

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
      if (was_reading) release(u);  // what arrived is not the contents
      throw;
    }
    u.where = Where::resident;  // a unit still being written holds its latest values in memory
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

  /// Frees written-back units until fewer than `buffers` are in memory, waiting for the oldest
  /// write when none has finished. False when no write is left to wait for.
  bool make_room() {
    while (resident_ >= buffers_) {
      if (writing_.empty()) return false;
      retire(writing_.front());
    }
    return true;
  }

  void retire_finished_writes() {
    while (!writing_.empty()) {
      UnitSwap& u = units_[writing_.front()];
      const auto ready = [&](UringFile::Ticket t) { return file_->ready(t); };
      if (!std::all_of(u.tickets.begin(), u.tickets.end(), ready)) return;
      retire(writing_.front());
    }
  }

  /// A written-back unit's memory freed; throws if its write failed.
  void retire(std::size_t unit) {
    writing_.erase(std::find(writing_.begin(), writing_.end(), unit));
    wait_then_release(units_[unit]);
  }

  /// Waits for `u`'s reads or writes, then frees its memory, also when one failed (then throws).
  void wait_then_release(UnitSwap& u) {
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

  std::string what_;
  std::vector<UnitSwap> units_;
  std::deque<std::size_t> writing_;  // units whose write-back is under way, oldest first
  int resident_ = 0;                 // units whose storages have elements (reading, resident, writing)
  int buffers_ = 1;
  UringFile* file_ = nullptr;
};

namespace detail {
/// settle() on every one of `swaps`, also after one of them throws; then throws the first failure.
inline void settle_all(std::span<NvmeSwap* const> swaps) {
  std::exception_ptr first;
  for (NvmeSwap* swap : swaps) {
    try {
      swap->settle();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}
inline void settle_all(std::initializer_list<NvmeSwap*> swaps) {
  settle_all(std::span<NvmeSwap* const>(swaps.begin(), swaps.size()));
}
}  // namespace detail

}  // namespace polyshard
