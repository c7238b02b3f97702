// Tensor<T, Cuda> against the host tensor: transfers, fill, views, strided copies, accounting.
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

#include "polyshard/tensor/cuda/transfer.hpp"
#include "polyshard/tensor/tensor.hpp"

using namespace polyshard;

namespace {
template <class T>
Tensor<T> iota_tensor(const Shape& shape) {
  auto t = Tensor<T>::empty(shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = T(static_cast<float>(i % 251) - 125.0f);
  return t;
}
}  // namespace

TEMPLATE_TEST_CASE("host -> device -> host returns the same elements", "[cuda][tensor]", float, double, half,
                   bfloat16, std::int32_t, std::int64_t) {
  const auto host = iota_tensor<TestType>(Shape{3, 5, 7});
  const auto device = to_device(host);
  CHECK(device.shape() == host.shape());
  CHECK(to_host(device).to_vector() == host.to_vector());
  CHECK(device.to_vector() == host.to_vector());
}

TEMPLATE_TEST_CASE("fill writes every element of a device tensor and nothing beyond it", "[cuda][tensor]", float,
                   half, bfloat16, std::int32_t) {
  auto whole = to_device(iota_tensor<TestType>(Shape{1001}));
  whole.flat_view(3, 997).fill(TestType(2));
  const auto v = whole.to_vector();
  const auto original = iota_tensor<TestType>(Shape{1001}).to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const bool inside = i >= 3 && i < 1000;
    CHECK(v[i] == (inside ? TestType(2) : original[i]));
  }
}

TEMPLATE_TEST_CASE("contiguous() of a transposed or sliced device view equals the host's", "[cuda][tensor]", float,
                   bfloat16, std::int64_t) {
  const auto host = iota_tensor<TestType>(Shape{4, 33, 17});
  const auto device = to_device(host);
  CHECK(device.transpose().contiguous().to_vector() == host.transpose().contiguous().to_vector());
  CHECK(device.slice(1, 3).transpose().clone().to_vector() == host.slice(1, 3).transpose().clone().to_vector());
  auto dst = Tensor<TestType, Cuda>::empty(Shape{4, 17, 33});
  dst.copy_from(device.transpose());
  CHECK(dst.to_vector() == host.transpose().contiguous().to_vector());
}

TEST_CASE("device tensors are counted under their category, and release and materialize move the count",
          "[cuda][tensor]") {
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  {
    auto t = Tensor<float, Cuda>::empty(Shape{256, 4}, MemoryCategory::Gradients);
    CHECK(tracker.current(MemoryCategory::Gradients) == 4096);
    t.storage()->release();
    CHECK(tracker.current(MemoryCategory::Gradients) == 0);
    CHECK_FALSE(t.storage()->materialized());
    t.storage()->materialize();
    CHECK(tracker.current(MemoryCategory::Gradients) == 4096);
    t.fill(1.5f);
    CHECK(t.to_vector() == std::vector<float>(1024, 1.5f));
  }
  CHECK(tracker.current(MemoryCategory::Gradients) == 0);
  auto u = Tensor<float, Cuda>::unmaterialized(Shape{8}, MemoryCategory::Parameters);
  CHECK(tracker.current(MemoryCategory::Parameters) == 0);
}
