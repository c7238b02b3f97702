// A growable scratch buffer for partial sums, counted as communication memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "polyshard/core/host_allocator.hpp"
#include "polyshard/core/memory_tracker.hpp"

namespace polyshard::detail::comm {

class Scratch {
 public:
  explicit Scratch(MemoryTracker* tracker = nullptr) : tracker_(tracker) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { release(); }

  /// At least `bytes` bytes, 64-byte aligned; keeps the old block when it is big enough, so a
  /// steady training step allocates nothing.
  void* get(std::size_t bytes) {
    if (bytes > bytes_) {
      release();
      data_ = CachingHostAllocator::instance().allocate(bytes);
      bytes_ = bytes;
      if (tracker_) tracker_->add(MemoryCategory::Communication, static_cast<std::int64_t>(bytes_));
    }
    return data_;
  }
  template <class T>
  T* get_as(std::size_t count) {
    return static_cast<T*>(get(count * sizeof(T)));
  }

  void set_tracker(MemoryTracker* tracker) {
    release();
    tracker_ = tracker;
  }

  void release() {
    if (data_) {
      CachingHostAllocator::instance().deallocate(data_, bytes_);
      if (tracker_) tracker_->sub(MemoryCategory::Communication, static_cast<std::int64_t>(bytes_));
    }
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  MemoryTracker* tracker_;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace polyshard::detail::comm
