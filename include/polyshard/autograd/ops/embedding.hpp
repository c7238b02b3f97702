// Differentiable embedding lookup: rows of a table gathered by integer ids.
#pragma once

#include "polyshard/core/precompiled.hpp"
#include "polyshard/autograd/ops/grad_out.hpp"
#include "polyshard/tensor/ops/embedding.hpp"

namespace polyshard {

/// table[ids]: ids (...) in [0, V), table (V, C); returns (..., C). An id out of range throws an
/// Error naming it and V. The backward pass scatter-adds into the table's gradient.
template <FloatElement T, Device D>
Var<T, D> embedding(const Tensor<std::int32_t, D>& ids, const Var<T, D>& table) {
  POLYSHARD_CHECK(table.shape().rank() == 2, "embedding: table must be (V, C), got shape ", table.shape());
  Shape ys = ids.shape();
  ys.push_back(table.shape()[1]);
  Tensor<T, D> y = Tensor<T, D>::empty(ys);  // (..., C)
  embedding_forward(ids, table.value(), y);
  return make_result(std::move(y), "embedding", {table}, [ids](Node<T, D>& self) {
    embedding_backward(ids, self.grad, detail::grad_out(self, 0));
  });
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_EMBEDDING_INSTANCES(EXTERN, T) \
  EXTERN template Var<T, Cpu> embedding<T, Cpu>(const Tensor<std::int32_t, Cpu>&, const Var<T, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_EMBEDDING_INSTANCES)

}  // namespace polyshard
