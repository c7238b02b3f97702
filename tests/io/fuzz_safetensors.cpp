// libFuzzer target: any bytes given to the safetensors reader yield a header and tensors, or a
// polyshard::Error; never a crash, an out-of-bounds access or a huge allocation.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "polyshard/io/safetensors_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace polyshard;
  try {
    const SafetensorsFile f = SafetensorsFile::from_memory({reinterpret_cast<const std::byte*>(data), size}, "fuzz");
    for (const SafetensorsTensorInfo& t : f.tensors()) {
      std::vector<std::byte> raw(static_cast<std::size_t>(t.nbytes()));
      f.read_bytes(t, raw);
      const auto core = to_core_dtype(t.dtype);
      if (!core) continue;
      // Both the direct path and the converting one, into a float and an integer type.
      if (*core == DType::F64 || *core == DType::F32 || *core == DType::F16 || *core == DType::BF16) {
        (void)f.read<float>(t.name, DTypeConversion::convert);
      } else {
        (void)f.read<std::int64_t>(t.name, DTypeConversion::convert);
      }
    }
  } catch (const Error&) {
    // Refusing a bad file is the expected outcome.
  }
  return 0;
}
