// A typed block of device memory from the stream-ordered pool, counted under a memory category
// for as long as it lives, with copies to and from the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "polyshard/core/cuda/device_memory_pool.hpp"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/memory_tracker.hpp"

namespace polyshard::cuda {

/// `numel` elements of T on the current device, allocated and freed in `stream`'s order.
/// Elements are uninitialized. Device code sees T's CUDA counterpart (device_t<T>).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t numel, MemoryCategory category, cudaStream_t stream = nullptr)
      : numel_(numel), category_(category), stream_(stream), pool_(&DeviceMemoryPool::current()),
        tracker_(&current_memory_tracker()) {
    data_ = static_cast<T*>(pool_->allocate(bytes(), stream_));
    tracker_->add(category_, static_cast<std::int64_t>(bytes()));
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return data_; }
  std::size_t numel() const { return numel_; }
  std::size_t bytes() const { return numel_ * sizeof(T); }
  cudaStream_t stream() const { return stream_; }

  /// Frees in the buffer's stream order; later work on other streams must be ordered by event.
  void reset() {
    if (data_) {
      pool_->deallocate(data_, stream_);
      tracker_->sub(category_, static_cast<std::int64_t>(bytes()));
    }
    data_ = nullptr;
    numel_ = 0;
  }

  /// Copies host elements in, asynchronously in the buffer's stream (the host span must stay
  /// alive until the stream reaches the copy; pageable memory makes the call wait).
  void copy_from_host(std::span<const T> host) {
    if (host.size() != numel_)
      throw Error("polyshard: copy of " + std::to_string(host.size()) + " host elements into a device buffer of " +
                  std::to_string(numel_));
    POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(data_, host.data(), bytes(), cudaMemcpyHostToDevice, stream_));
  }
  /// Copies the elements out and waits for them.
  std::vector<T> to_host() const {
    std::vector<T> out(numel_);
    POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(out.data(), data_, bytes(), cudaMemcpyDeviceToHost, stream_));
    POLYSHARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out;
  }
  /// Sets every byte to `byte` (0xFF poisons floating-point elements with NaN).
  void fill_bytes(unsigned char byte) {
    POLYSHARD_CUDA_CHECK(cudaMemsetAsync(data_, byte, bytes(), stream_));
  }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(numel_, o.numel_);
    std::swap(category_, o.category_);
    std::swap(stream_, o.stream_);
    std::swap(pool_, o.pool_);
    std::swap(tracker_, o.tracker_);
  }
  T* data_ = nullptr;
  std::size_t numel_ = 0;
  MemoryCategory category_ = MemoryCategory::Other;
  cudaStream_t stream_ = nullptr;
  DeviceMemoryPool* pool_ = nullptr;
  MemoryTracker* tracker_ = nullptr;
};

/// A device buffer holding a copy of `host`.
template <class T>
DeviceBuffer<T> to_device(std::span<const T> host, MemoryCategory category, cudaStream_t stream = nullptr) {
  DeviceBuffer<T> b(host.size(), category, stream);
  b.copy_from_host(host);
  return b;
}

}  // namespace polyshard::cuda
