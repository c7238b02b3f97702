// Per-communicator counters of calls and bytes sent, per collective kind.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "polyshard/comm/reduce_op.hpp"

namespace polyshard {

/// Calls and bytes sent by one rank of one communicator, per collective kind. Bytes follow
/// ring_bytes_sent() for every backend, so the figures compare against a strategy's formula.
/// Counted when a collective is issued (an asynchronous one counts before it completes).
/// Safe to read from any thread while collectives run.
class CommStats {
 public:
  CommStats() = default;
  CommStats(const CommStats& other) { *this = other; }
  CommStats& operator=(const CommStats& other) {
    for (std::size_t i = 0; i < collective_kind_count; ++i) {
      calls_[i].store(other.calls_[i].load());
      bytes_[i].store(other.bytes_[i].load());
    }
    return *this;
  }

  /// Counts one call of `kind` that sends `bytes` (from ring_bytes_sent()).
  void record(CollectiveKind kind, double bytes) {
    const auto i = static_cast<std::size_t>(kind);
    calls_[i].fetch_add(1, std::memory_order_relaxed);
    bytes_[i].fetch_add(bytes, std::memory_order_relaxed);
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

  /// Sets every counter to zero (for example at the start of a training step).
  void reset() {
    for (std::size_t i = 0; i < collective_kind_count; ++i) {
      calls_[i].store(0);
      bytes_[i].store(0);
    }
  }

 private:
  std::array<std::atomic<std::uint64_t>, collective_kind_count> calls_{};
  std::array<std::atomic<double>, collective_kind_count> bytes_{};
};

}  // namespace polyshard
