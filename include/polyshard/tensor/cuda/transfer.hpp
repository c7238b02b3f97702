// Moving tensors between host and device: the only places a Tensor<T, Cuda> meets host memory.
#pragma once

#include <cuda_runtime_api.h>

#include "polyshard/core/cuda/current_stream.hpp"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/tensor/cuda/storage.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// A device copy of a host tensor (contiguous), queued on the current stream. The host tensor's
/// storage is kept alive by the caller until the stream reaches the copy; pageable host memory
/// makes the call wait for it.
template <Element T>
Tensor<T, Cuda> to_device(const Tensor<T, Cpu>& host, MemoryCategory category = current_memory_category()) {
  const Tensor<T, Cpu> c = host.contiguous();
  auto out = Tensor<T, Cuda>::empty(c.shape(), category);
  POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(out.data(), c.data(), c.bytes(), cudaMemcpyHostToDevice, cuda::current_stream()));
  if (c.storage() != host.storage()) POLYSHARD_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream()));
  return out;
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
