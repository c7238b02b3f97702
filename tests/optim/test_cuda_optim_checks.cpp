// Host-side checks of the fused optimizers, run on every machine (no GPU needed): their
// arguments are validated before any launch, so these sentences are exercised wherever CI runs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

#include "polyshard/optim/cuda/fused_optimizers.hpp"

using namespace polyshard;

namespace {
struct Fake {
  std::uintptr_t slot;
  float* data() const { return reinterpret_cast<float*>(slot << 20); }
};
}  // namespace

TEST_CASE("fused optimizers reject bad arguments before launching", "[cuda][optim]") {
  using Catch::Matchers::Contains;
  // Distinct aligned addresses that no check dereferences.
  const Fake a{1}, b{2}, c{3}, d{4};
  CHECK_THROWS_WITH((cuda::fused_adam_step<float, float>(a.data(), b.data(), c.data(), d.data(), nullptr, 8, {}, 0,
                                                         false, 1.0f, nullptr)),
                    Contains("fused_adam_step") && Contains("step counts from 1, got 0"));
  CHECK_THROWS_WITH((cuda::fused_adamw_step<float, float>(a.data(), b.data(), c.data(), d.data(), nullptr, 8, {}, 1,
                                                          INFINITY, nullptr)),
                    Contains("fused_adamw_step") && Contains("grad_scale must be finite"));
  CHECK_THROWS_WITH((cuda::fused_adam_step<float, float>(a.data(), nullptr, c.data(), d.data(), nullptr, 8, {}, 1,
                                                         false, 1.0f, nullptr)),
                    Contains("fused_adam_step") && Contains("null array for 8 elements"));
  CHECK_THROWS_WITH((cuda::fused_adam_step<float, float>(a.data(), b.data(), c.data(), d.data(), a.data(), 8, {}, 1,
                                                         false, 1.0f, nullptr)),
                    Contains("compute copy is the master array"));
  CHECK_THROWS_WITH((cuda::fused_sgd_step<float, float>(a.data(), b.data(), nullptr, nullptr, 8, {.momentum = 0.9}, 1,
                                                        1.0f, nullptr)),
                    Contains("fused_sgd_step") && Contains("needs a momentum_buffer"));
  CHECK_THROWS_WITH((cuda::fused_sgd_step<float, float>(a.data(), b.data(), c.data(), nullptr, 8, {}, 1, 1.0f, nullptr)),
                    Contains("fused_sgd_step") && Contains("keeps no buffer"));
  CHECK_THROWS_WITH((cuda::fused_adam_step<float, float>(a.data(), b.data(), c.data(), d.data(), nullptr, 8,
                                                         {.beta1 = 1.0}, 1, false, 1.0f, nullptr)),
                    Contains("fused_adam_step") && Contains("invalid beta1"));
  // Nothing to do is not an error, whatever the pointers.
  CHECK_NOTHROW(cuda::fused_adam_step<float, float>(nullptr, nullptr, nullptr, nullptr, nullptr, 0, {}, 1, false, 1.0f,
                                                    nullptr));
  CHECK_NOTHROW(cuda::fused_sgd_step<float, float>(nullptr, nullptr, nullptr, nullptr, 0, {.momentum = 0.9}, 1, 1.0f,
                                                   nullptr));
}
