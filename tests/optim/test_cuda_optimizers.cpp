// The fused GPU optimizers (Adam, AdamW, SGD) against their CPU twins, adam_update and
// sgd_update, over three steps: master weights, optimizer state and the compute copy.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "optim/reference.hpp"
#include "polyshard/core/cuda/device_buffer.hpp"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/optim/adam.hpp"
#include "polyshard/optim/cuda/fused_optimizers.hpp"
#include "polyshard/optim/sgd.hpp"
#include "support/gpu_compare.hpp"

using namespace polyshard;

namespace {

// (gradient type, compute-copy type): the compositions fused_optimizers.cu instantiates.
template <class G_, class P_>
struct Types {
  using G = G_;
  using P = P_;
};
using Fp32 = Types<float, float>;
using Bf16 = Types<bfloat16, bfloat16>;
using Fp16 = Types<half, half>;
using Fp32GradsBf16Copy = Types<float, bfloat16>;
using Fp32GradsFp16Copy = Types<float, half>;

// Distance in units in the last place between two finite values of T (float, half, bfloat16),
// counting +0 and -0 as equal.
template <class T>
std::int64_t ulp_distance(T a, T b) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;
  static_assert(sizeof(T) == sizeof(Bits));
  auto key = [](T x) {
    Bits bits;
    std::memcpy(&bits, &x, sizeof(T));
    constexpr Bits sign = Bits(1) << (8 * sizeof(T) - 1);
    const auto magnitude = static_cast<std::int64_t>(bits & Bits(sign - 1));
    return (bits & sign) ? -magnitude : magnitude;
  };
  const std::int64_t d = key(a) - key(b);
  return d < 0 ? -d : d;
}

// The compute copy: element_cast<P> of the GPU's own master, bit for bit, and within one ulp of P
// of the cast of the CPU's master. The masters themselves may differ in their last bits: GCC
// contracts the CPU kernel's multiply-adds into FMAs (-march=native), the GPU kernel rounds every
// operation. Where an update cancels a weight to nearly zero, that difference (an ulp of the
// weight before the step) can exceed an ulp of the result, so a copy also passes when it is within
// the master's own tolerance (relative to the largest weight) of the CPU's cast.
template <class P>
void check_compute_copy(const std::vector<P>& copy, const std::vector<float>& gpu_master,
                        const std::vector<float>& cpu_master) {
  double largest = 1e-6;
  for (const float x : cpu_master) largest = std::max(largest, std::abs(static_cast<double>(x)));
  const double abs_tol = test::gpu_tolerance<float>() * largest;
  std::size_t not_cast = 0, far = 0, first_bad = copy.size();
  for (std::size_t i = 0; i < copy.size(); ++i) {
    const P from_gpu = element_cast<P>(gpu_master[i]);
    if (std::memcmp(&copy[i], &from_gpu, sizeof(P)) != 0) {
      ++not_cast;
      first_bad = std::min(first_bad, i);
    }
    const P from_cpu = element_cast<P>(cpu_master[i]);
    const double diff = std::abs(static_cast<double>(static_cast<float>(copy[i])) -
                                 static_cast<double>(static_cast<float>(from_cpu)));
    if (!std::isfinite(static_cast<float>(copy[i])) || (ulp_distance(copy[i], from_cpu) > 1 && diff > abs_tol)) {
      ++far;
      first_bad = std::min(first_bad, i);
    }
  }
  INFO("compute copy: " << not_cast << " elements differ from the cast of the GPU master, " << far
                        << " are more than one ulp from the cast of the CPU master (first at " << first_bad << ")");
  CHECK(not_cast == 0);
  CHECK(far == 0);
}

struct AdamCase {
  std::string name;
  AdamConfig config;
  bool decoupled;
  float grad_scale;    // what an engine passes: 1 / loss_scale times the clip coefficient
  double grad_range;   // gradients uniform in [-grad_range, grad_range), as they arrive (scaled)
};

struct SgdCase {
  std::string name;
  SgdConfig config;
  float grad_scale;
  double grad_range;
};

// The gradient the kernels use: grad[i] * grad_scale, rounded to float (the CPU twin's input).
template <class G>
std::vector<float> scaled(const std::vector<G>& grad, float grad_scale) {
  std::vector<float> out(grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i) out[i] = static_cast<float>(grad[i]) * grad_scale;
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("fused_adam_step matches adam_update over three steps", "[cuda][optim]", Fp32, Bf16, Fp16,
                   Fp32GradsBf16Copy, Fp32GradsFp16Copy) {
  using G = typename TestType::G;
  using P = typename TestType::P;
  const auto c = GENERATE(values<AdamCase>({
      {"Adam", {.lr = 1e-2}, false, 1.0f, 1.0},
      {"Adam, weight decay, loss-scaled gradients", {.lr = 1e-2, .weight_decay = 0.1}, false, 0.7f / 1024, 1024.0},
      {"AdamW", {.lr = 1e-2, .weight_decay = 0.05}, true, 1.0f, 1.0},
      {"AdamW, beta1 below 0.5, large eps, clipped", {.lr = 5e-2, .beta1 = 0.3, .beta2 = 0.99, .eps = 1e-3, .weight_decay = 0.2},
       true, 0.25f, 2.0},
  }));
  // 100003: about a hundred blocks of packs and a tail of 3 (the emulated device, the slower
  // under the sanitizers, spends its time per element).
  const std::size_t n = GENERATE(as<std::size_t>(), 1, 7, 100003);
  const std::size_t offset = GENERATE(as<std::size_t>(), 0, 1);  // 1: every array misaligned by one element
  bool with_copy = true;
  if constexpr (std::is_same_v<P, float>) with_copy = GENERATE(true, false);  // fp32 compute: no copy to keep
  INFO(c.name << ", n = " << n << ", offset " << offset << (with_copy ? "" : ", no compute copy"));

  std::vector<float> master = test::random_values<float>(n, 11);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  test::DeviceSpan<float> d_master(n, offset), d_m(n, offset), d_v(n, offset);
  test::DeviceSpan<G> d_grad(n, offset);
  test::DeviceSpan<P> d_copy(n, offset);
  d_master.upload(master);
  d_m.upload(m);
  d_v.upload(v);
  for (std::int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    const std::vector<G> grad = test::random_values<G>(n, 100 + static_cast<std::uint64_t>(step), c.grad_range);
    d_grad.upload(grad);
    d_copy.poison();
    cuda::fused_adam_step<G, P>(d_master.data(), d_grad.data(), d_m.data(), d_v.data(),
                                with_copy ? d_copy.data() : nullptr, n, c.config, step, c.decoupled, c.grad_scale,
                                nullptr);
    adam_update<float, float>(master, scaled(grad, c.grad_scale), m, v, c.config, step, c.decoupled);

    const std::vector<float> got_master = d_master.read("master");
    const double tol = test::gpu_tolerance<float>();
    CHECK(test::relative_error<float, float>(got_master, master) <= tol);
    CHECK(test::relative_error<float, float>(d_m.read("exp_avg"), m) <= tol);
    CHECK(test::relative_error<float, float>(d_v.read("exp_avg_sq"), v) <= tol);
    const std::vector<P> copy = d_copy.read("compute copy");
    if (with_copy) {
      check_compute_copy<P>(copy, got_master, master);
    } else {
      const std::vector<unsigned char> bytes(copy.size() * sizeof(P), 0xFF);
      INFO("no compute copy was asked for, but the poisoned array changed");
      CHECK(std::memcmp(copy.data(), bytes.data(), bytes.size()) == 0);
    }
  }
}

TEMPLATE_TEST_CASE("fused_sgd_step matches sgd_update over three steps", "[cuda][optim]", Fp32, Bf16, Fp16,
                   Fp32GradsBf16Copy, Fp32GradsFp16Copy) {
  using G = typename TestType::G;
  using P = typename TestType::P;
  const auto c = GENERATE(values<SgdCase>({
      {"SGD", {.lr = 0.1}, 1.0f, 1.0},
      {"SGD, weight decay, loss-scaled gradients", {.lr = 0.1, .weight_decay = 0.01}, 1.0f / 512, 512.0},
      {"momentum, dampening, weight decay", {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}, 1.0f, 1.0},
      {"Nesterov, clipped", {.lr = 0.05, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true}, 0.3f, 2.0},
  }));
  const std::size_t n = GENERATE(as<std::size_t>(), 1, 7, 100003);  // as for Adam
  const std::size_t offset = GENERATE(as<std::size_t>(), 0, 1);
  INFO(c.name << ", n = " << n << ", offset " << offset);
  const bool use_momentum = c.config.momentum != 0;

  std::vector<float> master = test::random_values<float>(n, 12);
  std::vector<float> buffer(use_momentum ? n : 0, 0.0f);
  test::DeviceSpan<float> d_master(n, offset), d_buffer(n, offset);  // d_buffer stays poisoned until step 1 writes it
  test::DeviceSpan<G> d_grad(n, offset);
  test::DeviceSpan<P> d_copy(n, offset);
  d_master.upload(master);
  for (std::int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    const std::vector<G> grad = test::random_values<G>(n, 200 + static_cast<std::uint64_t>(step), c.grad_range);
    d_grad.upload(grad);
    d_copy.poison();
    cuda::fused_sgd_step<G, P>(d_master.data(), d_grad.data(), use_momentum ? d_buffer.data() : nullptr,
                               d_copy.data(), n, c.config, step, c.grad_scale, nullptr);
    sgd_update<float, float>(master, scaled(grad, c.grad_scale), buffer, c.config, step);

    const std::vector<float> got_master = d_master.read("master");
    CHECK(test::relative_error<float, float>(got_master, master) <= test::gpu_tolerance<float>());
    if (use_momentum) {
      CHECK(test::relative_error<float, float>(d_buffer.read("momentum_buffer"), buffer) <=
            test::gpu_tolerance<float>());
    }
    check_compute_copy<P>(d_copy.read("compute copy"), got_master, master);
  }
}

TEMPLATE_TEST_CASE("fused optimizers give the same bits with and without 16-byte packs", "[cuda][optim]", Fp32,
                   Bf16, Fp32GradsFp16Copy) {
  // The packed and the scalar path run the same operations on every element: an aligned span and
  // the same values one element off (every array misaligned) must agree bit for bit.
  using G = typename TestType::G;
  using P = typename TestType::P;
  const std::size_t n = 4099;
  const std::vector<float> master = test::random_values<float>(n, 21);
  const std::vector<G> grad = test::random_values<G>(n, 22, 3.0);
  auto run = [&](std::size_t offset, bool adam) {
    test::DeviceSpan<float> d_master(n, offset), d_m(n, offset), d_v(n, offset);
    test::DeviceSpan<G> d_grad(n, offset);
    test::DeviceSpan<P> d_copy(n, offset);
    d_master.upload(master);
    d_m.upload(std::vector<float>(n, 0.0f));
    d_v.upload(std::vector<float>(n, 0.0f));
    d_grad.upload(grad);
    for (std::int64_t step = 1; step <= 2; ++step) {
      if (adam) {
        cuda::fused_adamw_step<G, P>(d_master.data(), d_grad.data(), d_m.data(), d_v.data(), d_copy.data(), n,
                                     AdamWConfig{.lr = 1e-2}, step, 0.5f, nullptr);
      } else {
        cuda::fused_sgd_step<G, P>(d_master.data(), d_grad.data(), d_m.data(), d_copy.data(), n,
                                   SgdConfig{.lr = 0.1, .momentum = 0.9, .nesterov = true}, step, 0.5f, nullptr);
      }
    }
    return std::make_tuple(d_master.read("master"), d_m.read("state"), d_copy.read("compute copy"));
  };
  for (const bool adam : {true, false}) {
    INFO((adam ? "AdamW" : "SGD"));
    const auto [p0, m0, c0] = run(0, adam);
    const auto [p1, m1, c1] = run(1, adam);
    CHECK(test::same_bits<float>(p0, p1));
    CHECK(test::same_bits<float>(m0, m1));
    CHECK(std::memcmp(c0.data(), c1.data(), n * sizeof(P)) == 0);
  }
}
