// Linear layer: y = x W^T + b with PyTorch's (out, in) weight layout.
#pragma once

#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

/// weight: (out, in), normal(0, std); bias: (out,), zeros.
template <FloatElement T, Device D = Cpu>
struct Linear {
  BOOST_HANA_DEFINE_STRUCT(Linear, (Parameter<T, D>, weight), (Parameter<T, D>, bias));

  Linear() = default;
  Linear(std::int64_t in_features, std::int64_t out_features, double std = 0.02)
      : weight({out_features, in_features}, ParameterInit::normal(std)), bias({out_features}, ParameterInit::zeros()) {}

  /// x: (..., in) -> (..., out).
  Var<T, D> operator()(const Var<T, D>& x) const { return linear(x, weight.var(), bias.var()); }
};

}  // namespace polyshard
