// A caching host allocator: freed blocks are kept by size and handed out again, so a training
// step in its steady state makes no system allocation. The process has one over pageable
// memory; a device runtime adds one over the memory it copies fastest from (page-locked for
// CUDA), and a HostAllocatorScope points a thread's host tensors at it.
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

/// Where a caching allocator's blocks come from when its cache misses, and go back to.
/// `allocate` returns memory aligned to CachingHostAllocator::alignment, or throws.
struct HostMemorySource {
  void* (*allocate)(std::size_t bytes);
  void (*free)(void* p);
};

namespace detail {
inline void* pageable_allocate(std::size_t bytes) {
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  return p;
}
inline void pageable_free(void* p) { std::free(p); }
}  // namespace detail

/// Blocks are 64-byte aligned (one cache line, one AVX-512 vector) and rounded up to a size
/// class, so buffers of nearly equal size share a free list.
class CachingHostAllocator {
 public:
  static constexpr std::size_t alignment = 64;

  /// The process's allocator of pageable memory. It is never destroyed: tensors owned by other
  /// static objects may be freed at exit after any static allocator would have been, and their
  /// blocks must still have somewhere to go. (The same holds for every other source's
  /// allocator: make them as this one, with `new`, and never delete them.)
  static CachingHostAllocator& instance() {
    static CachingHostAllocator* allocator =
        new CachingHostAllocator({detail::pageable_allocate, detail::pageable_free});
    return *allocator;
  }

  explicit CachingHostAllocator(HostMemorySource source) : source_(source) {}
  ~CachingHostAllocator() { release_cached(); }
  CachingHostAllocator(const CachingHostAllocator&) = delete;
  CachingHostAllocator& operator=(const CachingHostAllocator&) = delete;

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
        in_use_bytes_.fetch_add(size, std::memory_order_relaxed);
        return p;
      }
    }
    void* p = source_.allocate(size);
    system_allocations_.fetch_add(1, std::memory_order_relaxed);
    in_use_bytes_.fetch_add(size, std::memory_order_relaxed);
    return p;
  }

  void deallocate(void* p, std::size_t bytes) {
    if (!p) return;
    const std::size_t size = size_class(bytes);
    in_use_bytes_.fetch_sub(size, std::memory_order_relaxed);
    std::lock_guard lock(mutex_);
    free_[size].push_back(p);
    cached_bytes_ += size;
  }

  /// Returns every cached block to the system.
  void release_cached() {
    std::lock_guard lock(mutex_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) source_.free(p);
    free_.clear();
    cached_bytes_ = 0;
  }

  /// How many times a request missed the cache and went to the system.
  std::uint64_t system_allocations() const { return system_allocations_.load(); }
  /// Bytes handed out and not yet given back (in whole size classes).
  std::size_t in_use_bytes() const { return in_use_bytes_.load(); }
  std::size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }

 private:
  HostMemorySource source_;
  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_bytes_ = 0;
  std::atomic<std::uint64_t> system_allocations_{0};
  std::atomic<std::size_t> in_use_bytes_{0};
};

namespace detail {
inline CachingHostAllocator*& thread_host_allocator() {
  thread_local CachingHostAllocator* allocator = nullptr;
  return allocator;
}
}  // namespace detail

/// The allocator host tensors created on this thread take their memory from: the pageable
/// one unless a HostAllocatorScope says otherwise.
inline CachingHostAllocator& current_host_allocator() {
  CachingHostAllocator* a = detail::thread_host_allocator();
  return a ? *a : CachingHostAllocator::instance();
}

/// Points this thread's new host tensors at `allocator` until the scope ends (a tensor gives
/// its memory back to the allocator it came from, wherever it is freed).
class HostAllocatorScope {
 public:
  explicit HostAllocatorScope(CachingHostAllocator& allocator) : saved_(detail::thread_host_allocator()) {
    detail::thread_host_allocator() = &allocator;
  }
  ~HostAllocatorScope() { detail::thread_host_allocator() = saved_; }
  HostAllocatorScope(const HostAllocatorScope&) = delete;
  HostAllocatorScope& operator=(const HostAllocatorScope&) = delete;

 private:
  CachingHostAllocator* saved_;
};

}  // namespace polyshard
