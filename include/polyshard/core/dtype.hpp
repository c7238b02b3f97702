// Element types: float, double and the two 16-bit storage types, with their names and compute types.
#pragma once

#include <Eigen/Core>
#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace polyshard {

using half = Eigen::half;
using bfloat16 = Eigen::bfloat16;

/// Runtime tag of an element type, as safetensors and the communicators name them.
enum class DType : std::uint8_t { F64, F32, F16, BF16, I64, I32 };

template <class T>
struct dtype_traits;  // no entry: not an element type polyshard stores

template <>
struct dtype_traits<double> {
  static constexpr DType dtype = DType::F64;
  static constexpr std::string_view name = "F64";
  using compute_type = double;
};
template <>
struct dtype_traits<float> {
  static constexpr DType dtype = DType::F32;
  static constexpr std::string_view name = "F32";
  using compute_type = float;
};
// The 16-bit types are storage: CPU arithmetic on them converts to float and back.
template <>
struct dtype_traits<half> {
  static constexpr DType dtype = DType::F16;
  static constexpr std::string_view name = "F16";
  using compute_type = float;
};
template <>
struct dtype_traits<bfloat16> {
  static constexpr DType dtype = DType::BF16;
  static constexpr std::string_view name = "BF16";
  using compute_type = float;
};
template <>
struct dtype_traits<std::int64_t> {
  static constexpr DType dtype = DType::I64;
  static constexpr std::string_view name = "I64";
  using compute_type = std::int64_t;
};
template <>
struct dtype_traits<std::int32_t> {
  static constexpr DType dtype = DType::I32;
  static constexpr std::string_view name = "I32";
  using compute_type = std::int32_t;
};

/// A floating-point element type polyshard stores and communicates.
template <class T>
concept FloatElement = std::same_as<T, float> || std::same_as<T, double> ||
                       std::same_as<T, half> || std::same_as<T, bfloat16>;

/// An element type with a dtype_traits entry.
template <class T>
concept Element = FloatElement<T> || std::same_as<T, std::int64_t> || std::same_as<T, std::int32_t>;

template <Element T>
inline constexpr DType dtype_v = dtype_traits<T>::dtype;

/// The type CPU arithmetic on T runs in: T itself, or float for the 16-bit types.
template <Element T>
using compute_t = typename dtype_traits<T>::compute_type;

template <Element T>
inline constexpr std::string_view dtype_name_v = dtype_traits<T>::name;

/// Size in bytes of one element of a runtime dtype.
constexpr std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
  }
  return "?";
}

/// Converts between element types through their compute types (round to nearest even for 16-bit).
template <Element To, Element From>
constexpr To element_cast(From x) {
  if constexpr (std::same_as<To, From>) {
    return x;
  } else {
    return static_cast<To>(static_cast<compute_t<From>>(x));
  }
}

}  // namespace polyshard
