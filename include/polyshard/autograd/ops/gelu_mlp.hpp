// Differentiable GPT-2 feed-forward network as one op: linear, GELU, linear.
#pragma once

#include <concepts>

#include "polyshard/core/env_flag.hpp"
#include "polyshard/autograd/ops/gelu.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/autograd/ops/linear.hpp"

namespace polyshard {

/// Whether nn::Mlp takes gelu_mlp on a GPU: POLYSHARD_FUSED_MLP=0 keeps its three ops, to compare
/// the two in one build (read once).
inline bool fused_mlp_enabled() {
  static const bool enabled = detail::on_unless_zero("POLYSHARD_FUSED_MLP");
  return enabled;
}

/// linear(gelu(linear(x, fc_weight, fc_bias)), proj_weight, proj_bias). x: (..., C);
/// fc_weight: (H, C); fc_bias: (H); proj_weight: (O, H); proj_bias: (O). Returns (..., O).
/// On the host, the three ops. On a GPU, one node that saves what the three save (x, the GELU's
/// input and output) with fewer passes over the (..., H) activations: the first product's
/// epilogue adds the bias, applies GELU and keeps its input (linear_gelu_forward); in backward,
/// the product that makes the GELU output's gradient carries it through GELU' in its epilogue
/// (gelu_product_backward), so that gradient is never stored.
template <FloatElement T, Device D>
Var<T, D> gelu_mlp(const Var<T, D>& x, const Var<T, D>& fc_weight, const Var<T, D>& fc_bias,
                   const Var<T, D>& proj_weight, const Var<T, D>& proj_bias) {
  if constexpr (std::same_as<D, Cpu>) {
    return linear(gelu(linear(x, fc_weight, fc_bias)), proj_weight, proj_bias);
  } else {
    const Shape& xs = x.shape();
    const Shape& w1 = fc_weight.shape();
    const Shape& w2 = proj_weight.shape();
    POLYSHARD_CHECK(w1.rank() == 2 && w2.rank() == 2 && xs.rank() >= 1 && xs.back() == w1[1] && w2[1] == w1[0],
                    "gelu_mlp: input of shape ", xs, " does not fit weights of shapes ", w1, " and ", w2);
    POLYSHARD_CHECK(fc_bias.defined() && fc_bias.shape() == Shape{w1[0]} && proj_bias.defined() &&
                        proj_bias.shape() == Shape{w2[0]},
                    "gelu_mlp: biases of shapes ", fc_bias.shape(), " and ", proj_bias.shape(),
                    " do not fit weights of shapes ", w1, " and ", w2);
    const Tensor<T, D> x2 = x.value().contiguous().reshape({-1, w1[1]});  // (R, C)
    const std::int64_t rows = x2.size(0);
    Tensor<T, D> aux = Tensor<T, D>::empty({rows, w1[0]});  // GELU's input, (R, H)
    Tensor<T, D> g = Tensor<T, D>::empty({rows, w1[0]});    // GELU's output, (R, H)
    linear_gelu_forward(x2, fc_weight.value(), fc_bias.value(), g, aux);
    Shape ys = xs;
    ys[ys.rank() - 1] = w2[0];
    Tensor<T, D> y = Tensor<T, D>::empty(ys);  // (..., O)
    linear_forward(g, proj_weight.value(), proj_bias.value(), y.reshape({rows, w2[0]}));

    auto backward = [x2, aux, g](Node<T, D>& self) {
      const Tensor<T, D>& fc_w = self.inputs[1]->value;    // (H, C)
      const Tensor<T, D>& proj_w = self.inputs[3]->value;  // (O, H)
      const Tensor<T, D> dy = self.grad.reshape({-1, proj_w.size(0)});  // (R, O)
      linear_backward(g, proj_w, dy, GradOut<T, D>{}, detail::grad_out(self, 3), detail::grad_out(self, 4));
      GradOut<T, D> dx = detail::grad_out(self, 0);
      const GradOut<T, D> dfc_w = detail::grad_out(self, 1), dfc_b = detail::grad_out(self, 2);
      if (!dx.wanted() && !dfc_w.wanted() && !dfc_b.wanted()) return;
      Tensor<T, D> dh = Tensor<T, D>::empty(aux.shape());  // the GELU input's gradient, (R, H)
      gelu_product_backward(dy, proj_w, aux, dh);
      if (dx.wanted()) dx.tensor = dx.tensor.reshape({-1, fc_w.size(1)});  // (R, C)
      linear_backward(x2, fc_w, dh, dx, dfc_w, dfc_b);
    };
    Var<T, D> result = make_result(std::move(y), "gelu_mlp", {x, fc_weight, fc_bias, proj_weight, proj_bias},
                                   std::move(backward));
    result.node()->value_is_scratch = true;  // the backward reads x, aux, g, the weights and the gradient
    return result;
  }
}

}  // namespace polyshard
