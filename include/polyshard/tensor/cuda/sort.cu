// sort_pairs on a GPU: CUB's device-wide radix sort (stable for equal keys).
#include <cub/device/device_radix_sort.cuh>

#include "polyshard/tensor/cuda/sort.hpp"

namespace polyshard::cuda {

cudaError_t sort_pairs(void* temp, std::size_t& temp_bytes, const unsigned* keys_in, unsigned* keys_out,
                       const int* values_in, int* values_out, int n, int begin_bit, int end_bit, cudaStream_t stream) {
  return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, values_in, values_out, n, begin_bit,
                                         end_bit, stream);
}

}  // namespace polyshard::cuda
