// Which parameters the optimizer's weight decay applies to: every one by default, as PyTorch's
// optimizers decay every parameter of their group; decay_matrices_only() gives the rule of
// nanoGPT and Hugging Face's trainers, whose second parameter group (weight_decay=0) holds the
// biases and the norms' gains.
#pragma once

#include <cstddef>
#include <string>

#include "polyshard/nn/parameter.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

/// Exempts every parameter of fewer than two dimensions (biases, norm gains and shifts) from
/// weight decay, and decays the others (weights of matrix products, embeddings). Returns the
/// number exempted. Call it before constructing the engine, which reads the flags once.
template <Module M>
std::size_t decay_matrices_only(M& model) {
  std::size_t exempt = 0;
  visit_parameters(model, [&](const std::string&, auto& p) {
    const bool matrix = p.shape().rank() >= 2;
    p.set_weight_decay(matrix);
    if (!matrix) ++exempt;
  });
  return exempt;
}

}  // namespace polyshard
