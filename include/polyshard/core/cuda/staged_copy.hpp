// Copies between device memory and pageable host memory through two page-locked chunks: the
// link moves one chunk while the host copies the other into or out of the pageable buffer.
// A copy from or to pageable memory cannot use the DMA engine directly (its pages may move), so
// CUDA would stage it anyway, in a buffer of the driver's and without saying when; staging it
// here keeps a pageable offload buffer (StrategyConfig::pin_memory = false, DeepSpeed's
// default) on the stream the caller names and bounds the page-locked memory it costs to two
// chunks a copy in flight.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/cuda/pinned_allocator.hpp"
#include "polyshard/core/cuda/stream.hpp"

namespace polyshard::cuda {

/// The size of each of a staged copy's two page-locked chunks.
inline constexpr std::size_t staging_chunk_bytes = std::size_t{4} << 20;

/// Whether `host` is pageable host memory: neither page-locked (cudaHostAlloc, cudaHostRegister)
/// nor device or managed memory.
inline bool is_pageable(const void* host) {
  cudaPointerAttributes a{};
  POLYSHARD_CUDA_CHECK(cudaPointerGetAttributes(&a, host));
  return a.type == cudaMemoryTypeUnregistered;
}

namespace detail {
/// Two page-locked chunks from the caching pinned allocator and an event for each, on the
/// current device. On the way out (an error included) it waits for `stream`, so that no copy
/// still in flight writes into a chunk handed out again.
class StagingChunks {
 public:
  StagingChunks(std::size_t bytes, cudaStream_t stream) : bytes_(bytes), stream_(stream) {
    for (void*& c : chunk_) c = pinned_host_allocator().allocate(bytes_);
  }
  ~StagingChunks() {
    cudaStreamSynchronize(stream_);  // unchecked: an error is already on its way out, or was reported
    for (void* c : chunk_) pinned_host_allocator().deallocate(c, bytes_);
  }
  StagingChunks(const StagingChunks&) = delete;
  StagingChunks& operator=(const StagingChunks&) = delete;

  unsigned char* chunk(std::size_t k) { return static_cast<unsigned char*>(chunk_[k % 2]); }
  Event& ready(std::size_t k) { return ready_[k % 2]; }

 private:
  std::size_t bytes_;
  cudaStream_t stream_;
  void* chunk_[2] = {nullptr, nullptr};
  Event ready_[2];
};
}  // namespace detail

/// Copies `bytes` of device memory at `src` into pageable host memory at `host` on `stream`,
/// and returns when they are there. Chunk k+1 crosses the link while the host copies chunk k out.
inline void copy_to_pageable_host(void* host, const void* src, std::size_t bytes, cudaStream_t stream,
                                  std::size_t chunk_bytes = staging_chunk_bytes) {
  if (bytes <= chunk_bytes) {  // one chunk overlaps nothing: CUDA's own staging does as well
    POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream));
    POLYSHARD_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  detail::StagingChunks staging(chunk_bytes, stream);
  const std::size_t chunks = (bytes + chunk_bytes - 1) / chunk_bytes;
  const auto length = [&](std::size_t k) { return std::min(chunk_bytes, bytes - k * chunk_bytes); };
  const auto drain = [&](std::size_t k) {  // chunk k has crossed: out of its staging chunk
    staging.ready(k).synchronize();
    std::memcpy(static_cast<unsigned char*>(host) + k * chunk_bytes, staging.chunk(k), length(k));
  };
  for (std::size_t k = 0; k < chunks; ++k) {
    // Chunk k reuses chunk k-2's staging memory, which drain(k - 2) emptied in the last round.
    POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(staging.chunk(k), static_cast<const unsigned char*>(src) + k * chunk_bytes,
                                         length(k), cudaMemcpyDeviceToHost, stream));
    staging.ready(k).record(stream);
    if (k > 0) drain(k - 1);
  }
  drain(chunks - 1);
}

/// Copies `bytes` of pageable host memory at `host` into device memory at `dst` on `stream`,
/// and returns when they are there (the host memory may go away at once). The host fills
/// chunk k+1 while chunk k crosses the link.
inline void copy_from_pageable_host(void* dst, const void* host, std::size_t bytes, cudaStream_t stream,
                                    std::size_t chunk_bytes = staging_chunk_bytes) {
  if (bytes <= chunk_bytes) {
    POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream));
    POLYSHARD_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  detail::StagingChunks staging(chunk_bytes, stream);
  const std::size_t chunks = (bytes + chunk_bytes - 1) / chunk_bytes;
  for (std::size_t k = 0; k < chunks; ++k) {
    const std::size_t n = std::min(chunk_bytes, bytes - k * chunk_bytes);
    if (k >= 2) staging.ready(k).synchronize();  // chunk k-2 has crossed out of this staging memory
    std::memcpy(staging.chunk(k), static_cast<const unsigned char*>(host) + k * chunk_bytes, n);
    POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(static_cast<unsigned char*>(dst) + k * chunk_bytes, staging.chunk(k), n,
                                         cudaMemcpyHostToDevice, stream));
    staging.ready(k).record(stream);
  }
  POLYSHARD_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace polyshard::cuda
