// Comparing a kernel against its CPU twin: random inputs, outputs poisoned before the run (so an
// element the kernel never wrote shows up as NaN), a relative error with a bound per type, and
// guarded device spans that catch writes past either end.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "polyshard/core/cuda/device_buffer.hpp"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/dtype.hpp"

namespace polyshard::test {

/// The relative-error bound for outputs of element type T: fp32 well under 1e-5, the 16-bit
/// types about one rounding of their 8 (bf16) or 11 (fp16) significant bits.
template <class T>
constexpr double gpu_tolerance() {
  if constexpr (std::is_same_v<T, float>) return 2e-6;
  else if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, half>) return 2e-3;
  else return 1.6e-2;
}

/// Uniform values in [-scale, scale) rounded to T.
template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(static_cast<float>(u(rng)));
  return v;
}

/// A device buffer poisoned with NaN bytes, for a kernel's output.
template <class T>
cuda::DeviceBuffer<T> poisoned_device(std::size_t n, MemoryCategory category = MemoryCategory::Other) {
  cuda::DeviceBuffer<T> b(n, category);
  b.fill_bytes(0xFF);
  return b;
}

template <class T>
cuda::DeviceBuffer<T> device_copy(const std::vector<T>& host, MemoryCategory category = MemoryCategory::Other) {
  return cuda::to_device(std::span<const T>(host), category);
}

/// max |got - want| / max(max |want|, floor): one number per output, so a single wrong or
/// unwritten (NaN) element fails it. NaN anywhere gives infinity.
template <class G, class W>
double relative_error(std::span<const G> got, std::span<const W> want, double floor = 1e-6) {
  REQUIRE(got.size() == want.size());
  double worst = 0, scale = floor;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(static_cast<float>(got[i]));
    const double w = static_cast<double>(static_cast<float>(want[i]));
    if (!std::isfinite(g) && std::isfinite(w)) return INFINITY;
    worst = std::max(worst, std::abs(g - w));
    scale = std::max(scale, std::abs(w));
  }
  return worst / scale;
}

/// Checks a device result against the CPU twin's with T's tolerance (times `slack`).
template <class T, class W>
void check_close(const std::string& what, const cuda::DeviceBuffer<T>& got, const std::vector<W>& want,
                 double slack = 1.0) {
  const auto host = got.to_host();
  const double err = relative_error(std::span<const T>(host), std::span<const W>(want));
  INFO(what << ": relative error " << err << " (bound " << gpu_tolerance<T>() * slack << ")");
  CHECK(err <= gpu_tolerance<T>() * slack);
}

/// n elements of T placed `offset` elements into a device allocation, with one guard element
/// after them; the whole allocation starts poisoned (0xFF bytes, NaN), and the elements around the
/// span must still be poisoned whenever it is read back. An offset of 1 misaligns the span.
template <class T>
class DeviceSpan {
 public:
  DeviceSpan(std::size_t n, std::size_t offset) : n_(n), offset_(offset), buffer_(offset + n + 1, MemoryCategory::Other) {
    poison();
  }
  T* data() { return buffer_.data() + offset_; }
  void poison() { buffer_.fill_bytes(0xFF); }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    POLYSHARD_CUDA_CHECK(cudaMemcpy(data(), host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  /// The span's elements; fails the test when a guard element was written.
  std::vector<T> read(const std::string& what) const {
    const std::vector<T> all = buffer_.to_host();
    std::vector<unsigned char> poison_bytes(sizeof(T), 0xFF);
    bool guards = std::memcmp(&all[offset_ + n_], poison_bytes.data(), sizeof(T)) == 0;
    for (std::size_t i = 0; i < offset_; ++i) guards = guards && std::memcmp(&all[i], poison_bytes.data(), sizeof(T)) == 0;
    INFO(what << ": an element outside the span was written");
    CHECK(guards);
    return {all.begin() + static_cast<std::ptrdiff_t>(offset_), all.begin() + static_cast<std::ptrdiff_t>(offset_ + n_)};
  }

 private:
  std::size_t n_, offset_;
  cuda::DeviceBuffer<T> buffer_;
};

/// A device array of n elements starting `offset` elements into its buffer: offset 1 makes
/// every pointer misaligned for 16-byte packs.
template <class T>
struct OffsetDevice {
  cuda::DeviceBuffer<T> buffer;
  std::size_t offset = 0;
  T* get() const { return buffer.data() + offset; }
  std::vector<T> to_host() const {
    std::vector<T> all = buffer.to_host();
    return std::vector<T>(all.begin() + static_cast<std::ptrdiff_t>(offset), all.end());
  }
};

template <class T>
OffsetDevice<T> offset_copy(const std::vector<T>& host, std::size_t offset) {
  std::vector<T> padded(offset, T(0.f));
  padded.insert(padded.end(), host.begin(), host.end());
  return {device_copy(padded), offset};
}

template <class T>
OffsetDevice<T> offset_poisoned(std::size_t n, std::size_t offset) {
  return {poisoned_device<T>(n + offset), offset};
}

}  // namespace polyshard::test
