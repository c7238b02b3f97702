// Page-locked host memory for offload transfers: copies from it run asynchronously at full
// PCIe/NVLink-C2C speed, where pageable memory would be staged by the driver.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/memory_tracker.hpp"

namespace polyshard::cuda {

/// Pinned host memory counted under a category in the current tracker, as host memory is.
class PinnedHostBlock {
 public:
  PinnedHostBlock() = default;
  PinnedHostBlock(std::size_t bytes, MemoryCategory category)
      : bytes_(bytes), category_(category), tracker_(&current_memory_tracker()) {
    if (bytes_ == 0) return;
    POLYSHARD_CUDA_CHECK(cudaHostAlloc(&data_, bytes_, cudaHostAllocPortable));
    tracker_->add(category_, static_cast<std::int64_t>(bytes_));
  }
  ~PinnedHostBlock() { reset(); }
  PinnedHostBlock(PinnedHostBlock&& o) noexcept { swap(o); }
  PinnedHostBlock& operator=(PinnedHostBlock&& o) noexcept {
    PinnedHostBlock tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  PinnedHostBlock(const PinnedHostBlock&) = delete;
  PinnedHostBlock& operator=(const PinnedHostBlock&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  void reset() {
    if (!data_) return;
    cudaFreeHost(data_);
    tracker_->sub(category_, static_cast<std::int64_t>(bytes_));
    data_ = nullptr;
  }

 private:
  void swap(PinnedHostBlock& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(category_, o.category_);
    std::swap(tracker_, o.tracker_);
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryCategory category_ = MemoryCategory::Other;
  MemoryTracker* tracker_ = nullptr;
};

}  // namespace polyshard::cuda
