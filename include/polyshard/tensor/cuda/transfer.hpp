// Moving whole tensors between host and device memory.
#pragma once

#include "polyshard/tensor/cuda/storage.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// A contiguous device copy of a host tensor (on_device<Cuda>); waits for it, so the host
/// tensor may go away at once.
template <Element T>
Tensor<T, Cuda> to_device(const Tensor<T, Cpu>& host, MemoryCategory category = current_memory_category()) {
  return on_device<Cuda>(host, category);
}

/// A host copy of a device tensor; waits for it.
template <Element T>
Tensor<T, Cpu> to_host(const Tensor<T, Cuda>& device, MemoryCategory category = current_memory_category()) {
  const Tensor<T, Cuda> c = device.contiguous();
  auto out = Tensor<T, Cpu>::empty(c.shape(), category);
  Storage<T, Cuda>::copy_to_host(out.data(), c.data(), c.numel());
  return out;
}

}  // namespace polyshard
