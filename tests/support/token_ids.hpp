// Token ids for model tests: a fixed pseudo-random (B, T) batch below a vocabulary size.
#pragma once

#include "polyshard/core/counter_rng.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard::test {

inline Tensor<std::int32_t> random_ids(const Shape& shape, std::int64_t vocab, std::uint64_t seed) {
  auto t = Tensor<std::int32_t>::empty(shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = std::int32_t(splitmix64(seed + std::uint64_t(i)) % vocab);
  return t;
}

}  // namespace polyshard::test
