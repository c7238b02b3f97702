// Device tags: where a tensor's memory lives and which backend runs its ops.
#pragma once

#include <concepts>

namespace polyshard {

/// Host memory; ops run on the CPU (Eigen, a BLAS, vectorized loops).
struct Cpu {
  static constexpr const char* name = "cpu";
};

/// CUDA device memory; ops run as CUDA kernels and cuBLASLt calls.
struct Cuda {
  static constexpr const char* name = "cuda";
};

/// A device tag: an empty type with a printable name.
template <class D>
concept Device = std::same_as<D, Cpu> || std::same_as<D, Cuda>;

}  // namespace polyshard
