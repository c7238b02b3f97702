// GELU activation (tanh approximation, as GPT-2 uses): a module with no parameters.
#pragma once

#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

template <FloatElement T, Device D = Cpu>
struct Gelu {
  BOOST_HANA_DEFINE_STRUCT(Gelu);
  /// x: any shape, elementwise.
  Var<T, D> operator()(const Var<T, D>& x) const { return gelu(x); }
};

}  // namespace polyshard
