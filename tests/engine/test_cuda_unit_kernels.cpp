// The unit kernels against host computations: pack / unpack round trips, casts against Eigen's
// conversions, unscaling with the overflow flag, and the squared gradient norm against a double sum.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "polyshard/core/cuda/device_buffer.hpp"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/engine/cuda/unit_kernels.hpp"
#include "support/gpu_compare.hpp"

using namespace polyshard;

namespace {

template <class From_, class To_>
struct Cast {
  using From = From_;
  using To = To_;
};
using FloatToBf16 = Cast<float, bfloat16>;
using Bf16ToFloat = Cast<bfloat16, float>;
using FloatToFp16 = Cast<float, half>;
using Fp16ToFloat = Cast<half, float>;
using FloatToFloat = Cast<float, float>;
using Bf16ToBf16 = Cast<bfloat16, bfloat16>;
using Fp16ToFp16 = Cast<half, half>;

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// How many elements of `got` differ from `want` in their bits, and the first of them.
template <class T>
std::size_t count_bit_differences(const std::vector<T>& got, const std::vector<T>& want, std::size_t* first = nullptr) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!same_bits(got[i], want[i])) {
      if (bad == 0 && first) *first = i;
      ++bad;
    }
  }
  return bad;
}

int read_flag(const cuda::DeviceBuffer<int>& flag) { return flag.to_host()[0]; }

}  // namespace

// ---- pack / unpack -------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("pack_unit and unpack_unit round-trip many tensors of odd sizes in one launch",
                   "[cuda][engine]", float, half, bfloat16) {
  using T = TestType;
  // Sizes with every remainder modulo a pack, a large tensor, and an empty one. Tensors and flat
  // places alternate between 16-byte aligned and misaligned, so both paths run.
  const std::vector<std::size_t> sizes{1, 7, 8, 13, 1000003, 0, 16, 3, 4099, 31, 64, 2, 65537, 5, 9, 1, 1, 128, 33, 4096,
                                       17, 0, 6, 1023, 12, 8, 8, 1, 250, 777, 4, 15, 24, 100, 11, 3, 40000, 2, 19, 512,
                                       10};
  constexpr std::size_t pack = 16 / sizeof(T);
  std::vector<cuda::UnitEntry<T>> table;
  std::vector<std::size_t> tensor_at;  // each tensor's first element in one storage buffer
  std::size_t flat_numel = 0, storage_numel = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    // Flat place: packed tightly, or after a gap, or rounded up to a pack; storage likewise.
    if (k % 3 == 1) flat_numel += 1 + k % 5;
    if (k % 3 == 2) flat_numel = (flat_numel + pack - 1) / pack * pack;
    storage_numel = (storage_numel + pack - 1) / pack * pack + (k % 2 == 0 ? 0 : k % pack);
    table.push_back({nullptr, flat_numel, sizes[k]});
    tensor_at.push_back(storage_numel);
    flat_numel += sizes[k];
    storage_numel += sizes[k];
  }
  flat_numel += 3;  // a tail no entry covers
  INFO(table.size() << " tensors, flat buffer of " << flat_numel);

  // All tensors in one storage buffer (so that one download checks them all), initialized with
  // random values where a tensor lies and poisoned elsewhere.
  cuda::DeviceBuffer<T> storage = test::poisoned_device<T>(storage_numel);
  std::vector<T> storage_host(storage_numel);
  std::memset(static_cast<void*>(storage_host.data()), 0xFF, storage_numel * sizeof(T));
  const std::vector<T> values = test::random_values<T>(storage_numel, 5);
  for (std::size_t k = 0; k < table.size(); ++k) {
    if (sizes[k] > 0) table[k].tensor = storage.data() + tensor_at[k];
    std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(tensor_at[k]), sizes[k],
                storage_host.begin() + static_cast<std::ptrdiff_t>(tensor_at[k]));
  }
  storage.copy_from_host(storage_host);
  const std::size_t total = cuda::validate_unit_table<T>(table, flat_numel, "test table");
  cuda::DeviceBuffer<cuda::UnitEntry<T>> d_table =
      cuda::to_device(std::span<const cuda::UnitEntry<T>>(table), MemoryCategory::Other);

  // The flat buffer as pack_unit must leave it: the tensors at their places, poison elsewhere.
  std::vector<T> flat_want(flat_numel);
  std::memset(static_cast<void*>(flat_want.data()), 0xFF, flat_numel * sizeof(T));
  for (std::size_t k = 0; k < table.size(); ++k)
    std::copy_n(storage_host.begin() + static_cast<std::ptrdiff_t>(tensor_at[k]), sizes[k],
                flat_want.begin() + static_cast<std::ptrdiff_t>(table[k].offset));

  cuda::DeviceBuffer<T> flat = test::poisoned_device<T>(flat_numel);
  cuda::pack_unit<T>(d_table.data(), table.size(), total, flat.data(), nullptr);
  std::size_t first = 0;
  const std::size_t packed_wrong = count_bit_differences(flat.to_host(), flat_want, &first);
  INFO("pack_unit: " << packed_wrong << " flat elements wrong, the first at " << first);
  CHECK(packed_wrong == 0);

  storage.fill_bytes(0xFF);
  cuda::unpack_unit<T>(d_table.data(), table.size(), total, flat.data(), nullptr);
  const std::size_t unpacked_wrong = count_bit_differences(storage.to_host(), storage_host, &first);
  INFO("unpack_unit: " << unpacked_wrong << " tensor elements wrong, the first at " << first);
  CHECK(unpacked_wrong == 0);
}

// ---- casts ---------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("cast_span rounds as Eigen's conversions do, bit for bit", "[cuda][engine]", FloatToBf16,
                   Bf16ToFloat, FloatToFp16, Fp16ToFloat, FloatToFloat, Bf16ToBf16, Fp16ToFp16) {
  using From = typename TestType::From;
  using To = typename TestType::To;
  const std::size_t n = GENERATE(as<std::size_t>(), 1, 7, 1000003);
  const std::size_t offset = GENERATE(as<std::size_t>(), 0, 1);
  INFO("n = " << n << ", offset " << offset);
  std::vector<From> src = test::random_values<From>(n, 31, 4.0);
  // Values where rounding or range matters, at the front where they fit: signed zeros, infinities,
  // overflow of fp16 (exact and by rounding), fp16 subnormals, ties to even in bf16 and fp16, and
  // floats far outside fp16's range. (No float subnormals: not what master weights hold.)
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,        -0.0f,       inf,           -inf,       70000.0f,         -70000.0f,
                            65519.0f,    65520.0f,    1e-6f,         -3e-7f,     1.00390625f,      1.01171875f,
                            1.00048828125f, 1.00146484375f, 3e38f,   1e-30f,     -2.5f};
  for (std::size_t i = 0; i < std::size(specials) && i < n; ++i) src[i] = static_cast<From>(specials[i]);
  std::vector<To> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = element_cast<To>(src[i]);

  test::DeviceSpan<From> d_src(n, offset);
  test::DeviceSpan<To> d_dst(n, offset);
  d_src.upload(src);
  cuda::cast_span<From, To>(d_src.data(), d_dst.data(), n, nullptr);
  std::size_t first = 0;
  const std::size_t wrong = count_bit_differences(d_dst.read("dst"), want, &first);
  INFO(wrong << " elements differ from element_cast, the first at " << first);
  CHECK(wrong == 0);
  CHECK(count_bit_differences(d_src.read("src"), src) == 0);  // the source is only read
}

// ---- unscale with the overflow check -------------------------------------------------------------

TEMPLATE_TEST_CASE("unscale_and_check multiplies by inv_scale and flags inf and NaN before or after",
                   "[cuda][engine]", float, half, bfloat16) {
  using G = TestType;
  const std::size_t n = GENERATE(as<std::size_t>(), 1, 7, 1000003);
  const std::size_t offset = GENERATE(as<std::size_t>(), 0, 1);
  enum class Inject { None, Inf, NaN, OverflowAfter };
  const Inject inject = GENERATE(Inject::None, Inject::Inf, Inject::NaN, Inject::OverflowAfter);
  INFO("n = " << n << ", offset " << offset << ", injection " << static_cast<int>(inject));

  std::vector<G> grad = test::random_values<G>(n, 41, 1000.0);
  float inv_scale = 1.0f / 1024;
  std::mt19937_64 rng(static_cast<std::uint64_t>(n) * 4 + static_cast<std::uint64_t>(inject));
  const std::size_t at = std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  if (inject == Inject::Inf) grad[at] = static_cast<G>(at % 2 ? std::numeric_limits<float>::infinity()
                                                              : -std::numeric_limits<float>::infinity());
  if (inject == Inject::NaN) grad[at] = static_cast<G>(std::numeric_limits<float>::quiet_NaN());
  if (inject == Inject::OverflowAfter) {
    // Finite before, beyond G's range after: a scale below 1 (unusual, but the check is both ways).
    inv_scale = 4.0f;
    grad[at] = std::numeric_limits<G>::max();
  }
  INFO("injected at " << at);
  std::vector<G> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = static_cast<G>(static_cast<float>(grad[i]) * inv_scale);

  test::DeviceSpan<G> d_grad(n, offset);
  d_grad.upload(grad);
  cuda::DeviceBuffer<int> flag(1, MemoryCategory::Other);
  flag.fill_bytes(0);
  cuda::unscale_and_check<G>(d_grad.data(), n, inv_scale, flag.data(), nullptr);
  CHECK(read_flag(flag) == (inject == Inject::None ? 0 : 1));
  std::vector<G> got = d_grad.read("grad");
  if (inject == Inject::NaN) {
    CHECK(std::isnan(static_cast<float>(got[at])));  // any NaN: payloads may differ
    got[at] = want[at];
  }
  std::size_t first = 0;
  const std::size_t wrong = count_bit_differences(got, want, &first);
  INFO(wrong << " elements differ from grad * inv_scale rounded to G, the first at " << first);
  CHECK(wrong == 0);
}

TEST_CASE("unscale_and_check only ever sets the flag", "[cuda][engine]") {
  const std::vector<float> grad = test::random_values<float>(1000, 42);
  test::DeviceSpan<float> d_grad(grad.size(), 0);
  d_grad.upload(grad);
  cuda::DeviceBuffer<int> flag(1, MemoryCategory::Other);
  const int one = 1;
  POLYSHARD_CUDA_CHECK(cudaMemcpy(flag.data(), &one, sizeof(int), cudaMemcpyHostToDevice));
  cuda::unscale_and_check<float>(d_grad.data(), grad.size(), 0.5f, flag.data(), nullptr);
  CHECK(read_flag(flag) == 1);  // an earlier span's overflow stays flagged
  CHECK_NOTHROW(cuda::unscale_and_check<float>(nullptr, 0, 0.5f, nullptr, nullptr));
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(cuda::unscale_and_check<float>(d_grad.data(), grad.size(), INFINITY, flag.data(), nullptr),
                    Contains("unscale_and_check: inv_scale must be finite"));
}

// ---- gradient norm -------------------------------------------------------------------------------

namespace {

template <class G>
double host_squared_norm(const std::vector<G>& g) {
  double s = 0;
  for (const G& x : g) s += static_cast<double>(static_cast<float>(x)) * static_cast<double>(static_cast<float>(x));
  return s;
}

// The squared norm the kernels give for one span: partials, then the finishing sum.
template <class G>
float device_squared_norm(test::DeviceSpan<G>& span, std::size_t n) {
  cuda::DeviceBuffer<float> partials = test::poisoned_device<float>(cuda::squared_norm_blocks);
  cuda::DeviceBuffer<float> out = test::poisoned_device<float>(1);
  cuda::squared_norm_partials<G>(span.data(), n, partials.data(), false, nullptr);
  cuda::squared_norm_finish(partials.data(), out.data(), false, nullptr);
  return out.to_host()[0];
}

}  // namespace

TEMPLATE_TEST_CASE("squared_norm_partials and squared_norm_finish give the squared norm of a span",
                   "[cuda][engine]", float, half, bfloat16) {
  using G = TestType;
  const std::size_t n = GENERATE(as<std::size_t>(), 1, 7, 1000003);
  const std::size_t offset = GENERATE(as<std::size_t>(), 0, 1);
  INFO("n = " << n << ", offset " << offset);
  const std::vector<G> grad = test::random_values<G>(n, 51, 3.0);
  test::DeviceSpan<G> d_grad(n, offset);
  d_grad.upload(grad);
  const double want = host_squared_norm(grad);
  const float got = device_squared_norm(d_grad, n);
  INFO("device " << got << ", host " << want);
  CHECK(std::abs(static_cast<double>(got) - want) <= 1e-6 * want);
  // Deterministic: the same bits again.
  const float again = device_squared_norm(d_grad, n);
  CHECK(same_bits(got, again));
}

TEST_CASE("squared norm partials accumulate across spans of different types", "[cuda][engine]") {
  // A unit's gradient in three spans (an fp32 shard, misaligned; a bf16 span; an fp16 span), the
  // partials overwritten by the first and added to by the others, then two finishing sums into
  // one output (the second accumulating), as a strategy sums several units.
  const std::vector<float> a = test::random_values<float>(1000003, 61, 2.0);
  const std::vector<bfloat16> b = test::random_values<bfloat16>(7, 62, 2.0);
  const std::vector<half> c = test::random_values<half>(4099, 63, 2.0);
  test::DeviceSpan<float> da(a.size(), 1);
  test::DeviceSpan<bfloat16> db(b.size(), 0);
  test::DeviceSpan<half> dc(c.size(), 1);
  da.upload(a);
  db.upload(b);
  dc.upload(c);
  cuda::DeviceBuffer<float> partials = test::poisoned_device<float>(cuda::squared_norm_blocks);
  cuda::DeviceBuffer<float> partials2 = test::poisoned_device<float>(cuda::squared_norm_blocks);
  cuda::DeviceBuffer<float> out = test::poisoned_device<float>(1);
  cuda::squared_norm_partials<float>(da.data(), a.size(), partials.data(), false, nullptr);
  cuda::squared_norm_partials<bfloat16>(db.data(), b.size(), partials.data(), true, nullptr);
  cuda::squared_norm_partials<half>(nullptr, 0, partials.data(), true, nullptr);  // empty span: adds nothing
  cuda::squared_norm_finish(partials.data(), out.data(), false, nullptr);
  cuda::squared_norm_partials<half>(dc.data(), c.size(), partials2.data(), false, nullptr);
  cuda::squared_norm_finish(partials2.data(), out.data(), true, nullptr);
  const double want = host_squared_norm(a) + host_squared_norm(b) + host_squared_norm(c);
  const float got = out.to_host()[0];
  INFO("device " << got << ", host " << want);
  CHECK(std::abs(static_cast<double>(got) - want) <= 1e-6 * want);

  // An empty span alone overwrites the partials with zeros.
  cuda::squared_norm_partials<float>(nullptr, 0, partials.data(), false, nullptr);
  cuda::squared_norm_finish(partials.data(), out.data(), false, nullptr);
  CHECK(out.to_host()[0] == 0.0f);
}
