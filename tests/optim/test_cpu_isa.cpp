// The host kernels on every instruction set this machine runs (optim/detail/cpu_isa.hpp): the
// same bits as the portable kernels, and a compute copy written in the same pass that is the
// updated weights rounded exactly as element_cast rounds them.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "optim/reference.hpp"
#include "polyshard/optim/optim.hpp"

using namespace polyshard;
using test::same_bits;

namespace {

enum class Kind { Sgd, SgdMomentum, SgdNesterov, Adam, AdamW };

const char* name(Kind k) {
  switch (k) {
    case Kind::Sgd: return "sgd";
    case Kind::SgdMomentum: return "sgd momentum";
    case Kind::SgdNesterov: return "sgd nesterov";
    case Kind::Adam: return "adam";
    case Kind::AdamW: return "adamw";
  }
  return "?";
}

std::vector<CpuIsa> available_isas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512})
    if (isa <= detected_cpu_isa()) isas.push_back(isa);
  return isas;
}

// Restores the detected instruction set however the test ends.
struct IsaGuard {
  ~IsaGuard() { set_optimizer_isa(detected_cpu_isa()); }
};

// fp32 masters and state, `offset` elements into their allocations (misaligned for any vector).
struct State {
  std::vector<float> storage_p, storage_m, storage_v;
  std::span<float> p, m, v;
  State(std::size_t n, std::size_t offset)
      : storage_p(n + offset), storage_m(n + offset), storage_v(n + offset),
        p(storage_p.data() + offset, n), m(storage_m.data() + offset, n), v(storage_v.data() + offset, n) {
    const auto init = test::values(n, 11);
    std::copy(init.begin(), init.end(), p.begin());
  }
};

SgdConfig sgd_config(Kind kind) {
  switch (kind) {
    case Kind::SgdMomentum: return {.lr = 0.1, .momentum = 0.9, .dampening = 0.2, .weight_decay = 0.01};
    case Kind::SgdNesterov: return {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
    default: return {.lr = 0.1, .weight_decay = 0.01};
  }
}

// One step of `kind`, writing the compute copy in the same pass when `copy` is given.
template <class G, class C = bfloat16>
void step(Kind kind, State& s, std::span<const G> grad, std::int64_t n, std::span<C> copy = {},
          double grad_scale = 1.0) {
  const bool momentum = kind == Kind::SgdMomentum || kind == Kind::SgdNesterov;
  const std::span<float> buffer = momentum ? s.m : std::span<float>{};
  const AdamConfig adam{.lr = 0.01, .beta1 = 0.3, .weight_decay = 0.1};
  const bool adam_kind = kind == Kind::Adam || kind == Kind::AdamW;
  if (copy.empty()) {
    if (adam_kind) adam_update<float, G>(s.p, grad, s.m, s.v, adam, n, kind == Kind::AdamW, grad_scale);
    else sgd_update<float, G>(s.p, grad, buffer, sgd_config(kind), n, grad_scale);
  } else {
    if (adam_kind) adam_update<G, C>(s.p, grad, s.m, s.v, adam, n, kind == Kind::AdamW, copy, grad_scale);
    else sgd_update<G, C>(s.p, grad, buffer, sgd_config(kind), n, copy, grad_scale);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("every instruction set gives the portable kernels' bits", "[optim][isa]", float, half, bfloat16) {
  using G = TestType;
  IsaGuard guard;
  const Kind kind = GENERATE(Kind::Sgd, Kind::SgdMomentum, Kind::SgdNesterov, Kind::Adam, Kind::AdamW);
  const std::size_t n = 1000 + 13;  // whole vectors of 8 and 16 lanes, and a tail
  set_optimizer_isa(CpuIsa::Portable);
  State portable(n, 0);
  for (std::int64_t k = 1; k <= 3; ++k)
    step<G>(kind, portable, std::span<const G>(test::values_as<G>(n, 70 + k, 0.5)), k);
  CHECK_FALSE(same_bits<float>(portable.p, State(n, 0).p));  // it trained
  for (CpuIsa isa : available_isas()) {
    INFO(name(kind) << " on " << cpu_isa_name(isa));
    set_optimizer_isa(isa);
    State s(n, 3);
    for (std::int64_t k = 1; k <= 3; ++k)
      step<G>(kind, s, std::span<const G>(test::values_as<G>(n, 70 + k, 0.5)), k);
    CHECK(same_bits<float>(s.p, portable.p));
    CHECK(same_bits<float>(s.m, portable.m));
    CHECK(same_bits<float>(s.v, portable.v));
  }
}

// The engine hands the loss scale's inverse times the clipping coefficient to the update rather
// than rewriting the gradients (fp16 gradients unscaled in fp16 would underflow): each gradient
// is widened, then multiplied by the scale rounded to float, as the device kernels do it.
TEMPLATE_TEST_CASE("grad_scale: the bits of the update from gradients multiplied in float first", "[optim][isa]",
                   float, half, bfloat16) {
  using G = TestType;
  IsaGuard guard;
  const Kind kind = GENERATE(Kind::Sgd, Kind::SgdNesterov, Kind::Adam, Kind::AdamW);
  const bool with_copy = GENERATE(false, true);
  const std::size_t n = 1000 + 13;
  const double grad_scale = 0.37 / 65536;  // not a power of two: the products round
  for (CpuIsa isa : available_isas()) {
    INFO(name(kind) << " on " << cpu_isa_name(isa) << (with_copy ? ", with the compute copy" : ""));
    set_optimizer_isa(isa);
    State scaled(n, 1), premultiplied(n, 0);
    std::vector<half> copy(n), unused(n);
    for (std::int64_t k = 1; k <= 3; ++k) {
      const auto g = test::values_as<G>(n, 40 + k, 2000.0);
      std::vector<float> multiplied(n);
      for (std::size_t i = 0; i < n; ++i) multiplied[i] = static_cast<float>(g[i]) * static_cast<float>(grad_scale);
      step<G, half>(kind, scaled, std::span<const G>(g), k, with_copy ? std::span<half>(copy) : std::span<half>{},
                    grad_scale);
      step<float, half>(kind, premultiplied, std::span<const float>(multiplied), k,
                        with_copy ? std::span<half>(unused) : std::span<half>{});
    }
    CHECK_FALSE(same_bits<float>(scaled.p, State(n, 0).p));  // it trained
    CHECK(same_bits<float>(scaled.p, premultiplied.p));
    CHECK(same_bits<float>(scaled.m, premultiplied.m));
    CHECK(same_bits<float>(scaled.v, premultiplied.v));
    if (with_copy) CHECK(same_bits<half>(copy, unused));
  }
}

TEST_CASE("a gradient scale that is not finite is refused, naming it", "[optim][isa]") {
  State s(16, 0);
  const std::vector<float> g(16, 1.0f);
  CHECK_THROWS_WITH(step<float>(Kind::Adam, s, std::span<const float>(g), 1, {}, INFINITY),
                    Catch::Contains("adam_update: the gradient scale inf is not finite"));
  CHECK_THROWS_WITH(step<float>(Kind::Sgd, s, std::span<const float>(g), 1, {}, NAN),
                    Catch::Contains("sgd_update: the gradient scale nan is not finite"));
}

TEMPLATE_TEST_CASE("the compute copy written in the step is element_cast of the updated weights", "[optim][isa]",
                   half, bfloat16) {
  using C = TestType;
  IsaGuard guard;
  const Kind kind = GENERATE(Kind::Sgd, Kind::SgdNesterov, Kind::AdamW);
  const std::size_t n = 777;
  for (CpuIsa isa : available_isas()) {
    INFO(name(kind) << " on " << cpu_isa_name(isa));
    set_optimizer_isa(isa);
    State fused(n, 1), plain(n, 0);
    std::vector<C> copy(n, C(-1.0f));
    for (std::int64_t k = 1; k <= 2; ++k) {
      const auto g = test::values_as<bfloat16>(n, 90 + k, 0.5);
      step<bfloat16, C>(kind, fused, std::span<const bfloat16>(g), k, std::span<C>(copy));
      step<bfloat16>(kind, plain, std::span<const bfloat16>(g), k);
    }
    CHECK(same_bits<float>(fused.p, plain.p));
    std::vector<C> expected(n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = element_cast<C>(plain.p[i]);
    CHECK(same_bits<C>(copy, expected));
  }
}

TEMPLATE_TEST_CASE("rounding to the compute copy: ties, subnormals, infinities and NaN as element_cast",
                   "[optim][isa]", half, bfloat16) {
  using C = TestType;
  IsaGuard guard;
  // Weights an SGD step with lr = 0 leaves as they are (w + -0 * g == w), so the copy is the
  // rounding of chosen bit patterns: every tie and near-tie of both formats, the edges of the
  // subnormal and overflow ranges, both infinities and NaN, and random patterns.
  std::vector<std::uint32_t> bits;
  for (std::uint32_t hi : {0x00000000u, 0x00010000u, 0x3f800000u, 0x3f810000u, 0x477fe000u, 0x477ff000u,
                           0x7f7f0000u, 0x7f7fffffu, 0x38800000u, 0x33800000u, 0x33000000u, 0x007f0000u})
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      for (std::uint32_t sign : {0u, 0x80000000u}) bits.push_back(sign | hi | lo);
  for (std::uint32_t special : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u}) bits.push_back(special);
  std::uint64_t state = 12345;
  while (bits.size() < 4099) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const auto b = static_cast<std::uint32_t>(state >> 32);
    if ((b & 0x7f800000u) != 0x7f800000u) bits.push_back(b);  // NaN payloads aside: any NaN is NaN
  }
  const std::size_t n = bits.size();
  const std::vector<float> grad(n, 1.0f);
  for (CpuIsa isa : available_isas()) {
    INFO(cpu_isa_name(isa));
    set_optimizer_isa(isa);
    std::vector<float> w(n);
    for (std::size_t i = 0; i < n; ++i) w[i] = std::bit_cast<float>(bits[i]);
    std::vector<C> copy(n);
    sgd_update<float, C>(std::span<float>(w), std::span<const float>(grad), std::span<float>{}, {.lr = 0.0}, 1,
                         std::span<C>(copy));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const C expected = element_cast<C>(std::bit_cast<float>(bits[i]));
      const bool nan = std::isnan(static_cast<float>(expected));
      if (nan ? !std::isnan(static_cast<float>(copy[i]))
              : std::bit_cast<std::uint16_t>(copy[i]) != std::bit_cast<std::uint16_t>(expected)) {
        if (++wrong <= 5) UNSCOPED_INFO("0x" << std::hex << bits[i] << " -> 0x" << std::bit_cast<std::uint16_t>(copy[i])
                                             << ", element_cast gives 0x" << std::bit_cast<std::uint16_t>(expected));
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("a compute copy of the wrong size is refused, naming both sizes", "[optim][isa]") {
  std::vector<float> p(10), m(10), v(10), g(10);
  std::vector<bfloat16> copy(9);
  const auto update = [&] {
    adam_update<float, bfloat16>(std::span<float>(p), std::span<const float>(g), std::span<float>(m),
                                 std::span<float>(v), {}, 1, true, std::span<bfloat16>(copy));
  };
  CHECK_THROWS_WITH(update(), Catch::Contains("the compute copy has 9 elements, param 10"));
}

TEST_CASE("an instruction set the machine lacks is refused", "[optim][isa]") {
  IsaGuard guard;
  if (detected_cpu_isa() == CpuIsa::Avx512) {
    SUCCEED("this machine runs every instruction set");
  } else {
    CHECK_THROWS_WITH(set_optimizer_isa(CpuIsa::Avx512), Catch::Contains("this machine runs at most"));
  }
  CHECK(optimizer_isa() <= detected_cpu_isa());
}
