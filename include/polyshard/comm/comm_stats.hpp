// Per-communicator counters of calls and bytes sent, per collective kind.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "polyshard/comm/reduce_op.hpp"

namespace polyshard {

/// Calls and bytes of one rank of one communicator, per collective kind, in two measures:
/// - bytes sent, predicted: ring_bytes_sent() of each call, the same for every backend, so the
///   figures compare against a strategy's formula; counted when a collective is issued;
/// - bytes moved, measured: what this rank's backend really handed to its transport, counted as
///   it happens (the in-process backend: the bytes it copied from or into another rank's
///   memory; MPI: the bytes passed to its sends and, at a broadcast's root, to MPI_Ibcast). The
///   two agree for ring algorithms; docs/communication.md gives each backend's formula where
///   they differ. A backend that cannot see its traffic (real NCCL) records none.
/// Safe to read from any thread while collectives run.
class CommStats {
 public:
  CommStats() = default;
  CommStats(const CommStats& other) { *this = other; }
  CommStats& operator=(const CommStats& other) {
    for (std::size_t i = 0; i < collective_kind_count; ++i) {
      calls_[i].store(other.calls_[i].load());
      bytes_[i].store(other.bytes_[i].load());
      moved_[i].store(other.moved_[i].load());
    }
    return *this;
  }

  /// Adds every counter of `other`: the traffic of several communicators as one (the engine's
  /// over its shard group and its replicas, under hybrid sharding).
  CommStats& operator+=(const CommStats& other) {
    for (std::size_t i = 0; i < collective_kind_count; ++i) {
      calls_[i].fetch_add(other.calls_[i].load(), std::memory_order_relaxed);
      bytes_[i].fetch_add(other.bytes_[i].load(), std::memory_order_relaxed);
      moved_[i].fetch_add(other.moved_[i].load(), std::memory_order_relaxed);
    }
    return *this;
  }

  /// Counts one call of `kind` that sends `bytes` (from ring_bytes_sent()).
  void record(CollectiveKind kind, double bytes) {
    const auto i = static_cast<std::size_t>(kind);
    calls_[i].fetch_add(1, std::memory_order_relaxed);
    bytes_[i].fetch_add(bytes, std::memory_order_relaxed);
  }

  /// Counts `bytes` this rank's backend moved for a collective of `kind` (measured).
  void record_moved(CollectiveKind kind, double bytes) {
    moved_[static_cast<std::size_t>(kind)].fetch_add(bytes, std::memory_order_relaxed);
  }

  /// Bytes this rank sent in collectives of `kind` since construction or the last reset().
  double bytes_sent(CollectiveKind kind) const { return bytes_[static_cast<std::size_t>(kind)].load(); }
  /// Calls of `kind` since construction or the last reset().
  std::uint64_t calls(CollectiveKind kind) const { return calls_[static_cast<std::size_t>(kind)].load(); }

  /// Bytes sent over all kinds.
  double total_bytes_sent() const {
    double total = 0;
    for (const auto& b : bytes_) total += b.load();
    return total;
  }

  /// Bytes this rank's backend moved for collectives of `kind` (measured).
  double bytes_moved(CollectiveKind kind) const { return moved_[static_cast<std::size_t>(kind)].load(); }
  /// Bytes moved over all kinds (measured).
  double total_bytes_moved() const {
    double total = 0;
    for (const auto& b : moved_) total += b.load();
    return total;
  }

  /// Sets every counter to zero (for example at the start of a training step).
  void reset() {
    for (std::size_t i = 0; i < collective_kind_count; ++i) {
      calls_[i].store(0);
      bytes_[i].store(0);
      moved_[i].store(0);
    }
  }

 private:
  std::array<std::atomic<std::uint64_t>, collective_kind_count> calls_{};
  std::array<std::atomic<double>, collective_kind_count> bytes_{};
  std::array<std::atomic<double>, collective_kind_count> moved_{};
};

}  // namespace polyshard
