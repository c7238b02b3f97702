// Memory accounting per category and the caching allocator's reuse.
#include <catch2/catch.hpp>

#include "polyshard/tensor/tensor.hpp"

using namespace polyshard;

TEST_CASE("tensors are counted under their category until freed, with peaks", "[core]") {
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  {
    auto p = Tensor<float>::empty({100}, MemoryCategory::Parameters);
    CHECK(tracker.current(MemoryCategory::Parameters) == 400);
    {
      CategoryScope activations(MemoryCategory::Activations);
      auto a = Tensor<double>::empty({10, 10});
      CHECK(tracker.current(MemoryCategory::Activations) == 800);
      auto view = a.slice(0, 5);  // a view allocates nothing
      CHECK(tracker.current(MemoryCategory::Activations) == 800);
    }
    CHECK(tracker.current(MemoryCategory::Activations) == 0);
    CHECK(tracker.peak(MemoryCategory::Activations) == 800);
    CHECK(tracker.peak_total() == 1200);
  }
  CHECK(tracker.current_total() == 0);
  tracker.reset_peaks();
  CHECK(tracker.peak(MemoryCategory::Activations) == 0);
}

TEST_CASE("the caching allocator hands freed blocks out again", "[core]") {
  auto& alloc = CachingHostAllocator::instance();
  { auto warm = Tensor<float>::empty({12345}); }
  const auto before = alloc.system_allocations();
  for (int i = 0; i < 10; ++i) {
    auto t = Tensor<float>::empty({12345});
    auto u = Tensor<float>::empty({12000});  // same size class as the first, once that is in use
  }
  CHECK(alloc.system_allocations() - before <= 1);
  CHECK(CachingHostAllocator::size_class(4097) >= 4097);
  CHECK(CachingHostAllocator::size_class(4097) <= 4097 * 5 / 4 + 64);
  CHECK(reinterpret_cast<std::uintptr_t>(Tensor<float>::empty({3}).data()) % 64 == 0);
}

namespace {
// A memory source that counts its calls: how a test sees which allocator a tensor used.
std::int64_t source_allocations = 0, source_frees = 0;
void* counting_allocate(std::size_t bytes) {
  ++source_allocations;
  return std::aligned_alloc(CachingHostAllocator::alignment, bytes);
}
void counting_free(void* p) {
  ++source_frees;
  std::free(p);
}
}  // namespace

TEST_CASE("a HostAllocatorScope points new host tensors at another allocator, which takes them back", "[core]") {
  static CachingHostAllocator* counted = new CachingHostAllocator({counting_allocate, counting_free});
  MemoryTracker tracker;
  TrackerScope tracking(tracker);
  source_allocations = source_frees = 0;
  const auto before = CachingHostAllocator::instance().system_allocations();
  Tensor<float> staged, unmaterialized;
  {
    HostAllocatorScope scope(*counted);
    CHECK(&current_host_allocator() == counted);
    staged = Tensor<float>::empty({100000}, MemoryCategory::OptimizerState);
    unmaterialized = Tensor<float>::unmaterialized({5000}, MemoryCategory::Parameters);
  }
  CHECK(&current_host_allocator() == &CachingHostAllocator::instance());
  CHECK(source_allocations == 1);
  CHECK(counted->system_allocations() == 1);
  CHECK(tracker.current(MemoryCategory::OptimizerState) == 400000);  // counted as any host tensor
  CHECK(counted->in_use_bytes() >= 400000);

  // Freed outside the scope, the block goes back to the allocator it came from.
  staged = Tensor<float>();
  CHECK(counted->cached_bytes() >= 400000);
  CHECK(counted->in_use_bytes() == 0);
  CHECK(tracker.current(MemoryCategory::OptimizerState) == 0);
  // Materialized outside the scope, a tensor made inside it still draws from that allocator.
  unmaterialized.storage()->materialize();
  CHECK(source_allocations == 2);
  unmaterialized.storage()->release();
  // A tensor made outside every scope never touches it.
  { auto plain = Tensor<float>::empty({100000}); }
  CHECK(source_allocations == 2);
  CHECK(CachingHostAllocator::instance().system_allocations() - before <= 1);
  // Its cached blocks go back to its source, not to the process's allocator.
  counted->release_cached();
  CHECK(source_frees == 2);
  CHECK(counted->cached_bytes() == 0);
}
