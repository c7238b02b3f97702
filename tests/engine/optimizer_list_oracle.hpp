// The one-process oracle of an OptimizerList, written on flat buffers without the engine, and
// the list the engine tests train with (test_optimizer_list.cpp, and on a device
// test_cuda_engine_precision.cpp).
#pragma once

#include <algorithm>
#include <variant>

#include "engine_fixture.hpp"
#include "polyshard/optim/optimizer_list.hpp"

namespace polyshard::test {

using List = OptimizerList<AnyOptimizerConfig>;

/// Learning rates that are powers of two, so that scaling by their ratio is exact and one process
/// matches the oracle bit for bit.
constexpr double first_lr = 1.0 / 64;

/// SGD with momentum over the second block, Adam over the rest: two classes, two state kinds.
/// Adam's eps is large enough that gradients summed in another order across world sizes move
/// the parameters by no more than they move SGD's (with 1e-8, a near-zero gradient's update is
/// lr times its sign, whatever its last bits).
inline List sgd_and_adam() {
  return {{names_starting_with({"transformer.h.1."}), SgdConfig{.lr = first_lr, .momentum = 0.9}},
          {every_parameter(), AdamConfig{.lr = first_lr / 4, .beta1 = 0.8, .eps = 1e-4, .weight_decay = 0.01}}};
}

/// The oracle, without the engine: one process on flat buffers, each parameter stepped by the
/// first config of `list` whose selector takes its name, at that config's lr (the first's is
/// first_lr already): SGD by PyTorch's rule written out here (d = g + wd p; b = d on the first
/// step, then momentum b + (1 - dampening) d; p -= lr b), Adam by adam_update.
inline Parameters list_oracle(const List& list, int steps) {
  Gpt<float> model(tiny_gpt());
  FlatParameters<float> flat(model);
  flat.initialize(42);
  Tensor<float> values = flat.values(), grads = flat.grads();
  const auto n = flat.padded_numel();
  Tensor<float> m = Tensor<float>::zeros({n}), v = Tensor<float>::zeros({n}), buf = Tensor<float>::zeros({n});
  BatchSampler sampler(tiny_data(), 8, 6, 7);
  for (int step = 0; step < steps; ++step) {
    flat.zero_grad();
    const Batch b = sampler.batch(step);
    backward(model.loss(b.inputs, b.targets));
    flat.settle_grads();
    for (const auto& e : flat.entries()) {
      const auto& config = std::find_if(list.begin(), list.end(), [&](const auto& o) { return o.selects(e.name); })
                               ->config;
      const auto slice = [&](const Tensor<float>& t) { return t.flat_view(e.offset, e.numel()).span(); };
      if (const auto* sgd = std::get_if<SgdConfig>(&config)) {
        const auto p = slice(values), g = slice(grads), mb = slice(buf);
        for (std::size_t i = 0; i < p.size(); ++i) {
          const float d = g[i] + static_cast<float>(sgd->weight_decay) * p[i];
          const float damped = static_cast<float>(1 - sgd->dampening) * d;
          mb[i] = step == 0 ? d : static_cast<float>(sgd->momentum) * mb[i] + damped;
          p[i] -= static_cast<float>(sgd->lr) * mb[i];
        }
      } else {
        adam_update<float, float>(slice(values), slice(grads), slice(m), slice(v), std::get<AdamConfig>(config),
                                  step + 1, false);
      }
    }
  }
  return by_name(flat, values);
}

}  // namespace polyshard::test
