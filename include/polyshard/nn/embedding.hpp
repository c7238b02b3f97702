// Embedding table: rows looked up by integer id.
#pragma once

#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

/// weight: (num_embeddings, dim), normal(0, std).
template <FloatElement T, Device D = Cpu>
struct Embedding {
  BOOST_HANA_DEFINE_STRUCT(Embedding, (Parameter<T, D>, weight));

  Embedding() = default;
  Embedding(std::int64_t num_embeddings, std::int64_t dim, double std = 0.02)
      : weight({num_embeddings, dim}, ParameterInit::normal(std)) {}

  /// ids: (...) -> (..., dim).
  Var<T, D> operator()(const Tensor<std::int32_t, D>& ids) const { return embedding(ids, weight.var()); }
};

}  // namespace polyshard
