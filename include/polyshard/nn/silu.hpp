// SiLU activation (swish): a module with no parameters.
#pragma once

#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

template <FloatElement T, Device D = Cpu>
struct Silu {
  BOOST_HANA_DEFINE_STRUCT(Silu);
  /// x: any shape, elementwise x sigmoid(x).
  Var<T, D> operator()(const Var<T, D>& x) const { return silu(x); }
};

}  // namespace polyshard
