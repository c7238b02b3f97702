// GPT-2 on the GPU against GPT-2 on the host: the same module code instantiated for Cuda, the
// same initial values (drawn on the host and copied), the same loss and flat gradients.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "support/finite_difference.hpp"
#include "support/gpu_compare.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/transfer.hpp"
#include "polyshard/nn/nn.hpp"

using namespace polyshard;
using test::random_ids;

TEST_CASE("GPT-2 forward and backward on the GPU match the host, with and without checkpointed blocks",
          "[cuda][nn]") {
  const GptConfig config{.vocab_size = 97, .block_size = 24, .n_layer = 2, .n_head = 4, .n_embd = 64};
  const auto ids = random_ids(Shape{3, 24}, 97, 1), targets = random_ids(Shape{3, 24}, 97, 2);
  const bool checkpoint_blocks = GENERATE(false, true);

  Gpt<float> host(config);
  FlatParameters<float> host_flat(host);
  host_flat.initialize(7);
  const Var<float> host_loss = host.loss(ids, targets);
  backward(host_loss);
  host_flat.settle_grads();

  Gpt<float, Cuda> device(config);
  device.checkpoint_blocks = checkpoint_blocks;
  FlatParameters<float, Cuda> device_flat(device);
  device_flat.initialize(7);
  CHECK(device_flat.values().to_vector() == host_flat.values().to_vector());  // the same initial bits
  const Var<float, Cuda> device_loss = device.loss(to_device(ids), to_device(targets));
  backward(device_loss);
  device_flat.settle_grads();

  CHECK(detail::scalar_value(device_loss.value()) == Approx(detail::scalar_value(host_loss.value())).epsilon(1e-5));
  const auto g = device_flat.grads().to_vector();
  const auto w = host_flat.grads().to_vector();
  for (const auto& e : host_flat.entries()) {
    const auto begin = static_cast<std::size_t>(e.offset), n = static_cast<std::size_t>(e.numel());
    const double err = test::relative_error(std::span<const float>(g.data() + begin, n),
                                            std::span<const float>(w.data() + begin, n));
    INFO(e.name << ": relative error " << err);
    CHECK(err <= 5e-5);  // fp32 through every kernel of a GPT step
  }
}

TEST_CASE("a bf16 GPT-2 on the GPU tracks the fp32 host model", "[cuda][nn]") {
  const GptConfig config{.vocab_size = 97, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};
  const auto ids = random_ids(Shape{2, 16}, 97, 3), targets = random_ids(Shape{2, 16}, 97, 4);
  Gpt<float> host(config);
  FlatParameters<float> host_flat(host);
  host_flat.initialize(11);
  Gpt<bfloat16, Cuda> device(config);
  FlatParameters<bfloat16, Cuda> device_flat(device);
  device_flat.initialize(11);
  const double host_loss = double(detail::scalar_value(host.loss(ids, targets).value()));
  const double device_loss = double(float(detail::scalar_value(device.loss(to_device(ids), to_device(targets)).value())));
  // bf16 activations: a few parts in a thousand of a loss near log(97).
  CHECK(device_loss == Approx(host_loss).epsilon(2e-2));
}
