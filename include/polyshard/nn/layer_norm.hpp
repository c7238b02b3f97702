// Layer normalisation over the last dimension, with a learned scale and shift.
#pragma once

#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

/// weight: (dim,), ones; bias: (dim,), zeros; eps 1e-5 as in GPT-2.
template <FloatElement T, Device D = Cpu>
struct LayerNorm {
  BOOST_HANA_DEFINE_STRUCT(LayerNorm, (Parameter<T, D>, weight), (Parameter<T, D>, bias));
  double eps = 1e-5;

  LayerNorm() = default;
  explicit LayerNorm(std::int64_t dim, double eps_ = 1e-5)
      : weight({dim}, ParameterInit::ones()), bias({dim}, ParameterInit::zeros()), eps(eps_) {}

  /// x: (..., dim) -> (..., dim).
  Var<T, D> operator()(const Var<T, D>& x) const { return layer_norm(x, weight.var(), bias.var(), eps); }
};

}  // namespace polyshard
