// Device memory through CUDA's stream-ordered allocator: one memory pool per device with a
// release threshold, so that memory freed in one step is reused by the next without going back
// to the driver, and allocation and free are ordered on a stream like kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "polyshard/core/cuda/error.hpp"

namespace polyshard::cuda {

/// The pool of one device. `release_threshold` is how many bytes the pool keeps reserved
/// across synchronisations (unlimited by default: a training step's buffers are reused, never
/// returned); lower it where other processes share the GPU.
class DeviceMemoryPool {
 public:
  explicit DeviceMemoryPool(int device, std::uint64_t release_threshold = std::numeric_limits<std::uint64_t>::max())
      : device_(device) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    POLYSHARD_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    set_release_threshold(release_threshold);
  }
  ~DeviceMemoryPool() {
    if (pool_) cudaMemPoolDestroy(pool_);
  }
  DeviceMemoryPool(const DeviceMemoryPool&) = delete;
  DeviceMemoryPool& operator=(const DeviceMemoryPool&) = delete;

  /// The pool of `device`, created on first use and kept for the life of the process.
  static DeviceMemoryPool& of(int device) {
    static std::mutex mutex;
    // The table outlives static destruction too: a vector destroyed at exit would leave the pools
    // it points to unreachable, which LeakSanitizer reports as leaks.
    static auto* const pools = new std::vector<DeviceMemoryPool*>();
    std::lock_guard lock(mutex);
    if (device < 0) throw Error("polyshard: device memory pool of device " + std::to_string(device));
    if (pools->size() <= static_cast<std::size_t>(device)) pools->resize(static_cast<std::size_t>(device) + 1, nullptr);
    auto& p = (*pools)[static_cast<std::size_t>(device)];
    if (!p) p = new DeviceMemoryPool(device);  // never destroyed: buffers may be freed at exit
    return *p;
  }
  /// The pool of the calling thread's current device.
  static DeviceMemoryPool& current() {
    int device = 0;
    POLYSHARD_CUDA_CHECK(cudaGetDevice(&device));
    return of(device);
  }

  void set_release_threshold(std::uint64_t bytes) {
    POLYSHARD_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &bytes));
  }

  /// `bytes` usable once `stream` reaches this point; nullptr for zero bytes.
  void* allocate(std::size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t rc = cudaMallocFromPoolAsync(&p, bytes, pool_, stream);
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw Error("polyshard: out of device memory allocating " + std::to_string(bytes) + " bytes on device " +
                  std::to_string(device_) + " (" + std::to_string(reserved_bytes()) + " bytes reserved by the pool)");
    }
    POLYSHARD_CUDA_CHECK(rc);
    return p;
  }
  /// Returns the block to the pool once `stream` reaches this point.
  void deallocate(void* p, cudaStream_t stream) {
    if (p) POLYSHARD_CUDA_CHECK(cudaFreeAsync(p, stream));
  }

  /// Bytes the pool holds from the driver, in use or cached.
  std::uint64_t reserved_bytes() const {
    std::uint64_t v = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &v);
    return v;
  }
  /// Bytes handed out and not yet freed.
  std::uint64_t used_bytes() const {
    std::uint64_t v = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &v);
    return v;
  }
  int device() const { return device_; }
  cudaMemPool_t get() const { return pool_; }

 private:
  int device_;
  cudaMemPool_t pool_ = nullptr;
};

}  // namespace polyshard::cuda
