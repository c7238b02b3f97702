// Page-locked host memory for offload transfers: copies from it run at full PCIe/NVLink-C2C
// speed and may run asynchronously, where pageable memory would be staged by the driver.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/host_allocator.hpp"

namespace polyshard::cuda {

namespace detail {
inline void* pinned_allocate(std::size_t bytes) {
  void* p = nullptr;
  // Portable: pinned for every device of the process, as a rank's thread may use any of them.
  POLYSHARD_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return p;  // page-aligned, more than CachingHostAllocator::alignment
}
inline void pinned_free(void* p) { cudaFreeHost(p); }  // at exit the runtime may be gone: unchecked
}  // namespace detail

/// The process's caching allocator of pinned host memory. Pinning is slow (a system call and
/// page-table work per block), so freed blocks are kept and handed out again, as pageable ones
/// are. Host tensors take their memory from it inside a HostAllocatorScope naming it; they are
/// counted under their category as any host tensor.
inline CachingHostAllocator& pinned_host_allocator() {
  static CachingHostAllocator* allocator = new CachingHostAllocator({detail::pinned_allocate, detail::pinned_free});
  return *allocator;
}

}  // namespace polyshard::cuda
