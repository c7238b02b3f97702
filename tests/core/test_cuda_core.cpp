// Device memory, pinned host memory, streams and events (GPU tests: run where a device exists).
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "polyshard/core/cuda/device_buffer.hpp"
#include "polyshard/core/cuda/pinned_allocator.hpp"
#include "polyshard/core/cuda/runtime.hpp"
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

TEST_CASE("a failing CUDA call names itself", "[cuda][core]") {
  int* p = nullptr;
  CHECK_THROWS_WITH(POLYSHARD_CUDA_CHECK(cudaMemcpy(p, p + 1, 1ull << 40, cudaMemcpyDeviceToDevice)),
                    Catch::Contains("cudaMemcpy(p, p + 1") && Catch::Contains("failed"));
  cudaGetLastError();
}
