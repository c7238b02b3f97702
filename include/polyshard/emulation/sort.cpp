// sort_pairs on the emulated device: what cub::DeviceRadixSort::SortPairs computes (a stable sort
// by the key bits [begin_bit, end_bit)), as a host sort run in order on the stream.
#include "polyshard/tensor/cuda/sort.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "polyshard/emulation/initcheck.hpp"
#include "polyshard/emulation/runtime.hpp"

namespace polyshard::cuda {

cudaError_t sort_pairs(void* temp, std::size_t& temp_bytes, const unsigned* keys_in, unsigned* keys_out,
                       const int* values_in, int* values_out, int n, int begin_bit, int end_bit, cudaStream_t stream) {
  // CUB asks for some workspace; asking for a little keeps the caller's workspace handling tested.
  constexpr std::size_t workspace = 256;
  if (temp == nullptr) {
    temp_bytes = workspace;
    return cudaSuccess;
  }
  if (temp_bytes < workspace || n < 0 || begin_bit < 0 || end_bit > 32 || begin_bit > end_bit) {
    emulation::report_launch_error(cudaErrorInvalidValue,
                                   "sort_pairs: temp_bytes " + std::to_string(temp_bytes) + " (needs " +
                                       std::to_string(workspace) + "), n " + std::to_string(n) + ", bits [" +
                                       std::to_string(begin_bit) + ", " + std::to_string(end_bit) + ")");
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  for (const void* p : {static_cast<const void*>(keys_in), static_cast<const void*>(keys_out),
                        static_cast<const void*>(values_in), static_cast<const void*>(values_out)}) {
    const emulation::PointerInfo info = emulation::find_pointer(p);
    const auto end = static_cast<const char*>(info.base) + info.size;
    if (info.kind != emulation::MemoryKind::device ||
        static_cast<const char*>(p) + static_cast<std::size_t>(n) * 4 > end) {
      emulation::report_launch_error(cudaErrorInvalidValue, "sort_pairs: an array of " + std::to_string(n) +
                                                                " elements is not inside one device allocation");
      return cudaErrorInvalidValue;
    }
  }
  const unsigned mask = end_bit - begin_bit == 32 ? ~0u : ((1u << (end_bit - begin_bit)) - 1u) << begin_bit;
  emulation::enqueue(stream, "sort_pairs (cub::DeviceRadixSort::SortPairs)", [=] {
    std::vector<int> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return (keys_in[a] & mask) < (keys_in[b] & mask); });
    // Inputs and outputs may not overlap (as in CUB): read every input before writing.
    std::vector<unsigned> keys(static_cast<std::size_t>(n));
    std::vector<int> values(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      keys[static_cast<std::size_t>(i)] = keys_in[order[static_cast<std::size_t>(i)]];
      values[static_cast<std::size_t>(i)] = values_in[order[static_cast<std::size_t>(i)]];
    }
    std::memcpy(keys_out, keys.data(), keys.size() * sizeof(unsigned));
    std::memcpy(values_out, values.data(), values.size() * sizeof(int));
    emulation::initcheck::written(keys_out, keys.size() * sizeof(unsigned));
    emulation::initcheck::written(values_out, values.size() * sizeof(int));
  });
  return cudaSuccess;
}

}  // namespace polyshard::cuda
