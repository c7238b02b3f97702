// Linear layer without bias (nn.Linear(..., bias=False)): y = x W^T, the projections of Llama-style
// models.
#pragma once

#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

/// weight: (out, in), PyTorch's layout, normal(0, std).
template <FloatElement T, Device D = Cpu>
struct LinearNoBias {
  BOOST_HANA_DEFINE_STRUCT(LinearNoBias, (Parameter<T, D>, weight));

  LinearNoBias() = default;
  LinearNoBias(std::int64_t in_features, std::int64_t out_features, double std = 0.02)
      : weight({out_features, in_features}, ParameterInit::normal(std)) {}

  /// x: (..., in) -> (..., out).
  Var<T, D> operator()(const Var<T, D>& x) const { return linear(x, weight.var()); }
};

}  // namespace polyshard
