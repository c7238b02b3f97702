// A stable sort of (key, value) pairs on the device, by the low bits of the keys: the embedding
// backward's grouping of token positions by token. cub::DeviceRadixSort on a GPU; on the emulated
// device (docs/cuda.md) a stable host sort with the same outputs, as CUB is closed to the
// emulation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace polyshard::cuda {

/// Sorts `n` pairs by key bits [begin_bit, end_bit), equal keys keeping their order, on
/// `stream`: keys_out/values_out receive the sorted keys_in/values_in (all device memory).
/// Called with temp == nullptr it only sets temp_bytes to the workspace the sort needs; called
/// again with a workspace of that many bytes it sorts. Returns the runtime's status.
cudaError_t sort_pairs(void* temp, std::size_t& temp_bytes, const unsigned* keys_in, unsigned* keys_out,
                       const int* values_in, int* values_out, int n, int begin_bit, int end_bit,
                       cudaStream_t stream = nullptr);

}  // namespace polyshard::cuda
