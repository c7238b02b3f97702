// Counter-based randomness: a value is a pure function of (stream, index), so any slice of a
// random sequence can be produced on its own, on any rank, in any order, with the same result.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

namespace polyshard {

/// SplitMix64's finaliser: a bijective 64-bit mix with good avalanche.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// FNV-1a of a name: stable across platforms and runs, unlike std::hash.
constexpr std::uint64_t name_hash(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

/// 64 random bits for element `index` of `stream`.
constexpr std::uint64_t counter_bits(std::uint64_t stream, std::uint64_t index) {
  return splitmix64(stream ^ splitmix64(index));
}

/// A standard normal sample for element `index` of `stream` (Box-Muller on two 24-bit uniforms).
inline double counter_normal(std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t bits = counter_bits(stream, index);
  const double u1 = (static_cast<double>(bits >> 40) + 1.0) / 16777217.0;  // (0, 1]
  const double u2 = static_cast<double>(bits & 0xFFFFFF) / 16777216.0;     // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace polyshard
