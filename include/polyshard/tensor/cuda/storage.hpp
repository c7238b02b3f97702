// Device storage behind Tensor<T, Cuda>: a block from the device's stream-ordered pool, counted
// under a memory category, allocated and freed in the order of the thread's current stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

#include "polyshard/core/cuda/current_stream.hpp"
#include "polyshard/core/cuda/device_memory_pool.hpp"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/cuda/pinned_allocator.hpp"
#include "polyshard/core/cuda/staged_copy.hpp"
#include "polyshard/tensor/cuda/tensor_kernels.hpp"
#include "polyshard/tensor/storage.hpp"

namespace polyshard {

/// Device storage. Elements are left uninitialized. The block is freed in the stream that was
/// current when it was allocated; work on other streams that reads it must be ordered before
/// the free by an event (as the engine does for communication).
template <Element T>
class Storage<T, Cuda> : public ViewNames {
 public:
  Storage(std::size_t numel, MemoryCategory category)
      : numel_(numel), category_(category), tracker_(&current_memory_tracker()) {
    materialize();
  }
  Storage(std::size_t numel, MemoryCategory category, std::nullptr_t)
      : numel_(numel), category_(category), tracker_(&current_memory_tracker()) {}
  /// Wraps device memory the caller owns; nothing is counted or freed.
  Storage(T* external, std::size_t numel)
      : data_(external), numel_(numel), category_(MemoryCategory::Other), tracker_(nullptr), owned_(false) {}
  ~Storage() { release(); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  T* data() const { return data_; }
  bool materialized() const { return data_ != nullptr || numel_ == 0; }

  void release() {
    if (!owned_ || !data_) return;
    pool_->deallocate(data_, stream_);
    tracker_->sub(category_, static_cast<std::int64_t>(bytes()));
    data_ = nullptr;
  }
  void materialize() {
    if (!owned_ || data_ || numel_ == 0) return;
    tracker_ = &current_memory_tracker();
    pool_ = &cuda::DeviceMemoryPool::current();
    stream_ = cuda::current_stream();
    data_ = static_cast<T*>(pool_->allocate(bytes(), stream_));
    tracker_->add(category_, static_cast<std::int64_t>(bytes()));
  }
  std::size_t numel() const { return numel_; }
  std::size_t bytes() const { return numel_ * sizeof(T); }
  MemoryCategory category() const { return category_; }

  static void copy_view(T* out, const T* src, const Shape& shape, const Shape& strides, bool contiguous) {
    const cudaStream_t stream = cuda::current_stream();
    if (contiguous) {
      POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(out, src, static_cast<std::size_t>(shape.numel()) * sizeof(T),
                                           cudaMemcpyDeviceToDevice, stream));
      return;
    }
    POLYSHARD_CHECK(shape.rank() <= cuda::max_view_rank, "copy of a device view of rank ", shape.rank(),
                    ": at most ", cuda::max_view_rank, " dimensions");
    cuda::ViewLayout layout;
    layout.rank = shape.rank();
    for (int d = 0; d < shape.rank(); ++d) layout.shape[d] = shape[d], layout.strides[d] = strides[d];
    cuda::copy_view(out, src, layout, stream);
  }
  static void fill(T* out, std::int64_t n, T value) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    cuda::fill_bits(out, n, bits, cuda::current_stream());
  }
  /// The host allocator whose memory this device copies fastest to and from: pinned memory.
  static CachingHostAllocator& staging_allocator() { return cuda::pinned_host_allocator(); }
  /// Copies `n` device elements to host memory and waits for them; into pageable memory through
  /// page-locked chunks (cuda::copy_to_pageable_host).
  static void copy_to_host(T* host, const T* src, std::int64_t n) {
    const cudaStream_t stream = cuda::current_stream();
    if (n == 0) return;
    if (cuda::is_pageable(host))
      return cuda::copy_to_pageable_host(host, src, static_cast<std::size_t>(n) * sizeof(T), stream);
    POLYSHARD_CUDA_CHECK(
        cudaMemcpyAsync(host, src, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost, stream));
    POLYSHARD_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  /// Copies `n` host elements into device memory and waits for them (the host memory may go
  /// away at once); from pageable memory through page-locked chunks (cuda::copy_from_pageable_host).
  static void copy_from_host(T* dst, const T* host, std::int64_t n) {
    const cudaStream_t stream = cuda::current_stream();
    if (n == 0) return;
    if (cuda::is_pageable(host))
      return cuda::copy_from_pageable_host(dst, host, static_cast<std::size_t>(n) * sizeof(T), stream);
    POLYSHARD_CUDA_CHECK(
        cudaMemcpyAsync(dst, host, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyHostToDevice, stream));
    POLYSHARD_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

 private:
  T* data_ = nullptr;
  std::size_t numel_;
  MemoryCategory category_;
  MemoryTracker* tracker_;
  cuda::DeviceMemoryPool* pool_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool owned_ = true;
};

}  // namespace polyshard
