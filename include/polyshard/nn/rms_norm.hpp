// Root-mean-square normalisation over the last dimension with a learned scale (torch.nn.RMSNorm,
// Llama's norm).
#pragma once

#include <type_traits>

#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

/// torch.finfo(T).eps, the gap between 1 and the next value of T: torch.nn.RMSNorm's default eps.
template <FloatElement T>
constexpr double machine_epsilon() {
  if constexpr (std::is_same_v<T, double>) return 0x1p-52;
  else if constexpr (std::is_same_v<T, float>) return 0x1p-23;
  else if constexpr (std::is_same_v<T, half>) return 0x1p-10;
  else return 0x1p-7;  // bfloat16
}

/// weight: (dim,), ones. eps defaults to torch's (machine_epsilon<T>()); Llama checkpoints name
/// theirs (rms_norm_eps, 1e-5 or 1e-6).
template <FloatElement T, Device D = Cpu>
struct RMSNorm {
  BOOST_HANA_DEFINE_STRUCT(RMSNorm, (Parameter<T, D>, weight));
  double eps = machine_epsilon<T>();

  RMSNorm() = default;
  explicit RMSNorm(std::int64_t dim, double eps_ = machine_epsilon<T>()) : weight({dim}, ParameterInit::ones()), eps(eps_) {}

  /// x: (..., dim) -> (..., dim).
  Var<T, D> operator()(const Var<T, D>& x) const { return rms_norm(x, weight.var(), eps); }
};

}  // namespace polyshard
