// Memory accounting per category (parameters, gradients, optimizer state, ...) with peaks.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

namespace polyshard {

/// What a block of memory holds; every allocation is counted under exactly one.
enum class MemoryCategory : std::uint8_t {
  Parameters,
  Gradients,
  OptimizerState,
  Activations,
  Communication,
  /// Float copies a host keeps of 16-bit parameters and gradients to compute with (a device
  /// computes in the 16-bit buffers themselves).
  WorkingCopies,
  Other,
};
inline constexpr std::size_t memory_category_count = 7;

constexpr std::string_view memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Parameters: return "parameters";
    case MemoryCategory::Gradients: return "gradients";
    case MemoryCategory::OptimizerState: return "optimizer_state";
    case MemoryCategory::Activations: return "activations";
    case MemoryCategory::Communication: return "communication";
    case MemoryCategory::WorkingCopies: return "working_copies";
    case MemoryCategory::Other: return "other";
  }
  return "?";
}

/// Live and peak bytes per category. One tracker per rank: a rank's thread points its
/// allocations at its own tracker with TrackerScope, so in-process ranks count separately.
class MemoryTracker {
 public:
  void add(MemoryCategory c, std::int64_t bytes) {
    const auto i = static_cast<std::size_t>(c);
    const std::int64_t now = current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise(peak_[i], now);
    const std::int64_t total = total_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise(total_peak_, total);
  }
  void sub(MemoryCategory c, std::int64_t bytes) {
    current_[static_cast<std::size_t>(c)].fetch_sub(bytes, std::memory_order_relaxed);
    total_.fetch_sub(bytes, std::memory_order_relaxed);
  }

  std::int64_t current(MemoryCategory c) const { return current_[static_cast<std::size_t>(c)].load(); }
  std::int64_t peak(MemoryCategory c) const { return peak_[static_cast<std::size_t>(c)].load(); }
  std::int64_t current_total() const { return total_.load(); }
  std::int64_t peak_total() const { return total_peak_.load(); }

  /// Starts a new peak window at the current figures (for example at the start of a step).
  void reset_peaks() {
    for (std::size_t i = 0; i < memory_category_count; ++i) peak_[i].store(current_[i].load());
    total_peak_.store(total_.load());
  }

 private:
  static void raise(std::atomic<std::int64_t>& peak, std::int64_t value) {
    std::int64_t seen = peak.load(std::memory_order_relaxed);
    while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
    }
  }

  std::array<std::atomic<std::int64_t>, memory_category_count> current_{};
  std::array<std::atomic<std::int64_t>, memory_category_count> peak_{};
  std::atomic<std::int64_t> total_{0};
  std::atomic<std::int64_t> total_peak_{0};
};

namespace detail {
inline MemoryTracker& process_tracker() {
  static MemoryTracker tracker;
  return tracker;
}
inline MemoryTracker*& thread_tracker() {
  thread_local MemoryTracker* tracker = nullptr;
  return tracker;
}
inline MemoryCategory& thread_category() {
  thread_local MemoryCategory category = MemoryCategory::Activations;
  return category;
}
}  // namespace detail

/// The tracker this thread's allocations are counted in (the process-wide one unless a
/// TrackerScope says otherwise).
inline MemoryTracker& current_memory_tracker() {
  MemoryTracker* t = detail::thread_tracker();
  return t ? *t : detail::process_tracker();
}

/// The category a tensor allocated now is counted under when its creator names none.
inline MemoryCategory current_memory_category() { return detail::thread_category(); }

/// Points this thread's allocations at `tracker` until the scope ends.
class TrackerScope {
 public:
  explicit TrackerScope(MemoryTracker& tracker) : saved_(detail::thread_tracker()) {
    detail::thread_tracker() = &tracker;
  }
  ~TrackerScope() { detail::thread_tracker() = saved_; }
  TrackerScope(const TrackerScope&) = delete;
  TrackerScope& operator=(const TrackerScope&) = delete;

 private:
  MemoryTracker* saved_;
};

/// Counts this thread's unlabelled allocations under `category` until the scope ends.
class CategoryScope {
 public:
  explicit CategoryScope(MemoryCategory category) : saved_(detail::thread_category()) {
    detail::thread_category() = category;
  }
  ~CategoryScope() { detail::thread_category() = saved_; }
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

 private:
  MemoryCategory saved_;
};

}  // namespace polyshard
