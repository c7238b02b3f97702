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
