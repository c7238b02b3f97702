// A caching host allocator: freed blocks are kept by size and handed out again, so a training
// step in its steady state makes no system allocation.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace polyshard {

/// Blocks are 64-byte aligned (one cache line, one AVX-512 vector) and rounded up to a size
/// class, so buffers of nearly equal size share a free list.
class CachingHostAllocator {
 public:
  static constexpr std::size_t alignment = 64;

  /// The process's allocator. It is never destroyed: tensors owned by other static objects
  /// may be freed at exit after any static allocator would have been, and their blocks must
  /// still have somewhere to go.
  static CachingHostAllocator& instance() {
    static CachingHostAllocator* allocator = new CachingHostAllocator();
    return *allocator;
  }

  /// Rounds up to a multiple of 64 bytes below 4 KiB, and to a quarter power of two above,
  /// which bounds the waste at 25% while keeping the number of size classes small.
  static std::size_t size_class(std::size_t bytes) {
    if (bytes <= 4096) return (bytes + alignment - 1) / alignment * alignment;
    std::size_t p = 4096;
    while (p * 2 < bytes) p *= 2;
    const std::size_t quarter = p / 4;
    return (bytes + quarter - 1) / quarter * quarter;
  }

  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    const std::size_t size = size_class(bytes);
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= size;
        return p;
      }
    }
    void* p = std::aligned_alloc(alignment, size);
    if (!p) throw std::bad_alloc();
    system_allocations_.fetch_add(1, std::memory_order_relaxed);
    return p;
  }

  void deallocate(void* p, std::size_t bytes) {
    if (!p) return;
    const std::size_t size = size_class(bytes);
    std::lock_guard lock(mutex_);
    free_[size].push_back(p);
    cached_bytes_ += size;
  }

  /// Returns every cached block to the system.
  void release_cached() {
    std::lock_guard lock(mutex_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    cached_bytes_ = 0;
  }

  /// How many times a request missed the cache and went to the system.
  std::uint64_t system_allocations() const { return system_allocations_.load(); }
  std::size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }

 private:
  CachingHostAllocator() = default;
  ~CachingHostAllocator() { release_cached(); }

  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_bytes_ = 0;
  std::atomic<std::uint64_t> system_allocations_{0};
};

}  // namespace polyshard
