// Device storage behind Tensor<T, Cuda>: a block from the device's stream-ordered pool, counted
// under a memory category, allocated and freed in the order of the thread's current stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "polyshard/core/cuda/current_stream.hpp"
#include "polyshard/core/cuda/device_memory_pool.hpp"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/cuda/pinned_allocator.hpp"
#include "polyshard/core/cuda/staged_copy.hpp"
#include "polyshard/core/cuda/stream.hpp"
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
  /// Waits for all work on the current device, on every stream (torch.cuda.synchronize()).
  static void synchronize_device() { POLYSHARD_CUDA_CHECK(cudaDeviceSynchronize()); }

  /// release(), ordered after the work the current stream was given so far (a copy out of these
  /// elements) as well as after the work of the stream the block was allocated on.
  void release_after_current_work() {
    if (!owned_ || !data_) return;
    const cudaStream_t now = cuda::current_stream();
    if (now != stream_) {
      cuda::Event copied;
      copied.record(now);
      copied.wait(stream_);
    }
    release();
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

/// Copies between device memory and page-locked host memory that leave the host free: the
/// device orders them among its work. A checkpoint's input moved to host memory
/// (cpu_checkpointing) goes down on the current stream and comes back ahead of its use, on a
/// copy stream of the thread's own, while the current stream computes.
template <>
struct PinnedTransfers<Cuda> {
  /// The end of a copy: later work waits for it on the device, or the host waits for it.
  using Pending = std::shared_ptr<cuda::Event>;

  /// Copies `bytes` from device memory to page-locked `host` memory on the current stream; the
  /// stream's later work is ordered after it.
  static Pending to_host(void* host, const void* src, std::size_t bytes) {
    POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, cuda::current_stream()));
    auto done = std::make_shared<cuda::Event>();
    done->record(cuda::current_stream());
    return done;
  }
  /// Starts copying `bytes` from page-locked `host` memory to `dst` on this thread's copy stream,
  /// after everything the current stream was given so far (dst's allocation among it).
  static Pending to_device_ahead(void* dst, const void* host, std::size_t bytes) {
    cuda::Event given;
    given.record(cuda::current_stream());
    const cuda::Stream& copies = copy_stream();
    given.wait(copies);
    POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, copies));
    auto done = std::make_shared<cuda::Event>();
    done->record(copies);
    return done;
  }
  /// Orders the current stream's later work after `copy`.
  static void order_after(const Pending& copy) { copy->wait(cuda::current_stream()); }
  /// Waits on the host for `copy` (before the host memory it reads or writes is handed out
  /// again). Unchecked: it runs on the way out, where an error was reported already or will be
  /// by the next checked call.
  static void finish(const Pending& copy) noexcept { cudaEventSynchronize(copy->get()); }

 private:
  /// The calling thread's copy stream, on the device current when it first asks (a rank's thread
  /// keeps one device).
  static const cuda::Stream& copy_stream() {
    thread_local const cuda::Stream stream;
    return stream;
  }
};

}  // namespace polyshard
