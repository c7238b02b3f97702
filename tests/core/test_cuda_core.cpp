// Device memory, pinned host memory, streams and events (GPU tests: run where a device exists).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "polyshard/core/cuda/device_buffer.hpp"
#include "polyshard/core/cuda/pinned_allocator.hpp"
#include "polyshard/core/cuda/runtime.hpp"
#include "polyshard/core/cuda/staged_copy.hpp"
#include "polyshard/core/cuda/stream.hpp"
#include "polyshard/core/memory_tracker.hpp"
#include "polyshard/tensor/cuda/storage.hpp"
#include "polyshard/tensor/tensor.hpp"

using namespace polyshard;

TEST_CASE("device buffers are counted per category while they live", "[cuda][core]") {
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  cuda::Stream stream;
  {
    cuda::DeviceBuffer<float> params(1000, MemoryCategory::Parameters, stream);
    cuda::DeviceBuffer<float> state(3000, MemoryCategory::OptimizerState, stream);
    CHECK(tracker.current(MemoryCategory::Parameters) == 4000);
    CHECK(tracker.current(MemoryCategory::OptimizerState) == 12000);
    CHECK(cuda::DeviceMemoryPool::current().used_bytes() >= 16000);
  }
  CHECK(tracker.current(MemoryCategory::Parameters) == 0);
  CHECK(tracker.current(MemoryCategory::OptimizerState) == 0);
  CHECK(tracker.peak(MemoryCategory::OptimizerState) == 12000);
  stream.synchronize();
}

TEST_CASE("a device buffer round-trips host values through the stream-ordered pool", "[cuda][core]") {
  cuda::Stream stream;
  std::vector<float> host(1 << 20);
  std::iota(host.begin(), host.end(), 0.5f);
  auto device = cuda::to_device(std::span<const float>(host), MemoryCategory::Other, stream.get());
  CHECK(device.to_host() == host);
  device.fill_bytes(0);
  CHECK(device.to_host() == std::vector<float>(host.size(), 0.0f));
}

TEST_CASE("an event orders a copy on one stream before a read on another", "[cuda][core]") {
  cuda::Stream producer, consumer;
  cuda::Event done;
  std::vector<int> host(1 << 22, 7);
  cuda::DeviceBuffer<int> a(host.size(), MemoryCategory::Other, producer);
  cuda::DeviceBuffer<int> b(host.size(), MemoryCategory::Other, consumer);
  a.copy_from_host(std::span<const int>(host));
  done.record(producer);
  done.wait(consumer);
  REQUIRE(cudaMemcpyAsync(b.data(), a.data(), a.bytes(), cudaMemcpyDeviceToDevice, consumer) == cudaSuccess);
  CHECK(b.to_host() == host);
  producer.synchronize();
}

TEST_CASE("host tensors made in a scope of the pinned allocator are page-locked, counted and reused", "[cuda][core]") {
  MemoryTracker tracker;
  TrackerScope tracking(tracker);
  auto& pinned = cuda::pinned_host_allocator();
  const auto pinned_before = pinned.system_allocations();
  const auto is_pinned = [](const void* p) {
    cudaPointerAttributes attributes{};
    REQUIRE(cudaPointerGetAttributes(&attributes, p) == cudaSuccess);
    return attributes.type == cudaMemoryTypeHost;
  };
  void* first = nullptr;
  {
    HostAllocatorScope scope(pinned);
    auto t = Tensor<float>::empty({1 << 16}, MemoryCategory::OptimizerState);
    CHECK(tracker.current(MemoryCategory::OptimizerState) == (4 << 16));
    CHECK(is_pinned(t.data()));
    first = t.data();
  }
  CHECK(tracker.current(MemoryCategory::OptimizerState) == 0);
  {
    HostAllocatorScope scope(pinned);
    auto again = Tensor<float>::empty({1 << 16});
    CHECK(again.data() == first);  // the cached block, not a second pinning
  }
  CHECK(pinned.system_allocations() - pinned_before <= 1);
  auto pageable = Tensor<float>::empty({1 << 16});
  CHECK_FALSE(is_pinned(pageable.data()));
  // The staging allocator of device storage is this one; the host's is the pageable one.
  CHECK(&Storage<float, Cuda>::staging_allocator() == &pinned);
  CHECK(&Storage<float, Cpu>::staging_allocator() == &CachingHostAllocator::instance());
}

TEST_CASE("copies to and from pageable host memory go through two page-locked chunks, every byte in place",
          "[cuda][core]") {
  cuda::Stream stream;
  // Chunk sizes that divide the copy, that leave a short last chunk, and one larger than it.
  const std::size_t bytes = 40'000 * sizeof(std::int32_t);
  const std::size_t chunk = GENERATE(std::size_t{4'000}, std::size_t{7'001}, std::size_t{1} << 20);
  CAPTURE(chunk);
  std::vector<std::int32_t> host(bytes / sizeof(std::int32_t));
  std::iota(host.begin(), host.end(), -17);
  REQUIRE(cuda::is_pageable(host.data()));
  cuda::DeviceBuffer<std::int32_t> device(host.size(), MemoryCategory::Other, stream);
  cuda::copy_from_pageable_host(device.data(), host.data(), bytes, stream.get(), chunk);
  CHECK(device.to_host() == host);  // a pinned-path read of what the staged upload wrote

  std::vector<std::int32_t> back(host.size(), 0);
  cuda::copy_to_pageable_host(back.data(), device.data(), bytes, stream.get(), chunk);
  CHECK(back == host);
  // Each side stops where the copy ends: a staged chunk never runs past the buffers.
  std::vector<std::int32_t> part(host.size(), 99);
  cuda::copy_to_pageable_host(part.data(), device.data(), bytes - 3 * sizeof(std::int32_t), stream.get(), chunk);
  CHECK(std::equal(host.begin(), host.end() - 3, part.begin()));
  CHECK(part[part.size() - 3] == 99);
  CHECK(part.back() == 99);
}

TEST_CASE("device storage stages its copies of pageable host tensors and copies pinned ones directly",
          "[cuda][core]") {
  cuda::Stream stream;
  cuda::StreamScope on(stream.get());
  const std::int64_t n = (std::int64_t{3} * cuda::staging_chunk_bytes) / sizeof(float) + 5;  // four chunks
  auto pageable = Tensor<float>::empty({n});
  REQUIRE(cuda::is_pageable(pageable.data()));
  for (std::int64_t i = 0; i < n; ++i) pageable.data()[i] = static_cast<float>(i % 1021) - 0.25f;
  const auto device = on_device<Cuda>(pageable);
  auto pinned = host_staging_tensor<float, Cuda>({n});
  REQUIRE_FALSE(cuda::is_pageable(pinned.data()));
  copy_across(device, pinned);
  auto again = Tensor<float>::zeros({n});
  copy_across(device, again);
  CHECK(std::equal(pinned.data(), pinned.data() + n, pageable.data()));
  CHECK(std::equal(again.data(), again.data() + n, pageable.data()));
}

TEST_CASE("a failing CUDA call names itself", "[cuda][core]") {
  int* p = nullptr;
  CHECK_THROWS_WITH(POLYSHARD_CUDA_CHECK(cudaMemcpy(p, p + 1, 1ull << 40, cudaMemcpyDeviceToDevice)),
                    Catch::Contains("cudaMemcpy(p, p + 1") && Catch::Contains("failed"));
  cudaGetLastError();
}
