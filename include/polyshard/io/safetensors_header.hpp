// The safetensors header: its dtypes, its limits, and the validation of everything a hostile
// file could lie about, done on the header bytes and the file size before anything is allocated
// for tensor data.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/io/json.hpp"

namespace polyshard {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian values; polyshard reads them on little-endian hosts only");

/// Every element type the safetensors format names. Files may hold any of them; polyshard reads
/// into tensors those that map to a core DType (F64 F32 F16 BF16 I64 I32) and reports the rest.
enum class SafetensorsDType : std::uint8_t { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

namespace detail {
struct SafetensorsDTypeEntry {
  SafetensorsDType dtype;
  std::string_view name;
  std::uint64_t size;
  std::optional<DType> core;
};
inline constexpr SafetensorsDTypeEntry safetensors_dtypes[] = {
    {SafetensorsDType::BOOL, "BOOL", 1, std::nullopt},     {SafetensorsDType::U8, "U8", 1, std::nullopt},
    {SafetensorsDType::I8, "I8", 1, std::nullopt},         {SafetensorsDType::F8_E5M2, "F8_E5M2", 1, std::nullopt},
    {SafetensorsDType::F8_E4M3, "F8_E4M3", 1, std::nullopt}, {SafetensorsDType::I16, "I16", 2, std::nullopt},
    {SafetensorsDType::U16, "U16", 2, std::nullopt},       {SafetensorsDType::F16, "F16", 2, DType::F16},
    {SafetensorsDType::BF16, "BF16", 2, DType::BF16},      {SafetensorsDType::I32, "I32", 4, DType::I32},
    {SafetensorsDType::U32, "U32", 4, std::nullopt},       {SafetensorsDType::F32, "F32", 4, DType::F32},
    {SafetensorsDType::F64, "F64", 8, DType::F64},         {SafetensorsDType::I64, "I64", 8, DType::I64},
    {SafetensorsDType::U64, "U64", 8, std::nullopt},
};
inline const SafetensorsDTypeEntry& dtype_entry(SafetensorsDType d) {
  return safetensors_dtypes[static_cast<std::size_t>(d)];
}
}  // namespace detail

/// The format's name of a dtype ("BF16").
inline std::string_view safetensors_dtype_name(SafetensorsDType d) { return detail::dtype_entry(d).name; }
/// Bytes per element of a dtype.
inline std::uint64_t safetensors_dtype_size(SafetensorsDType d) { return detail::dtype_entry(d).size; }
/// The core DType a safetensors dtype maps to, if polyshard stores that type.
inline std::optional<DType> to_core_dtype(SafetensorsDType d) { return detail::dtype_entry(d).core; }
/// The safetensors dtype of a core DType.
inline SafetensorsDType to_safetensors_dtype(DType d) {
  for (const auto& e : detail::safetensors_dtypes)
    if (e.core == d) return e.dtype;
  detail::throw_error("to_safetensors_dtype: no safetensors name for ", dtype_name(d));
}
/// Looks a dtype up by its exact (case-sensitive) name.
inline std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view name) {
  for (const auto& e : detail::safetensors_dtypes)
    if (e.name == name) return e.dtype;
  return std::nullopt;
}

/// Headers longer than this are refused before any memory is allocated for them (the limit of
/// the reference implementation).
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

/// Longest shape a header may give (arrays in a header are shapes and offset pairs).
inline constexpr std::size_t safetensors_max_rank = 1024;

/// One tensor's entry in a validated header. Offsets are absolute positions in the file.
struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t numel;       ///< product of `shape` (1 for a scalar)
  std::uint64_t data_begin;  ///< byte offset in the file
  std::uint64_t data_end;    ///< one past the last byte
  std::uint64_t nbytes() const { return data_end - data_begin; }
};

/// A header whose every claim has been checked against the file size.
struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;                   ///< in data order
  std::vector<std::pair<std::string, std::string>> metadata;  ///< "__metadata__", in file order
  std::uint64_t header_bytes = 0;                               ///< length of the JSON text
  std::uint64_t file_bytes = 0;

  /// The tensor named `name`, or nullptr.
  const SafetensorsTensorInfo* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  /// The metadata value of `key`, or nullptr.
  const std::string* metadata_value(std::string_view key) const {
    for (const auto& [k, v] : metadata)
      if (k == key) return &v;
    return nullptr;
  }
};

namespace detail {

template <class... Parts>
[[noreturn]] void safetensors_error(std::string_view file, const Parts&... parts) {
  throw_error("safetensors file '", file, "': ", parts...);
}

/// a * b, or nothing when it overflows 64 bits.
inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::uint64_t read_u64_le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline SafetensorsTensorInfo parse_tensor_entry(std::string_view file, const std::string& name, const JsonValue& v) {
  if (v.kind != JsonValue::Kind::Object)
    safetensors_error(file, "entry of tensor '", name, "' is ", json_kind_name(v.kind), ", not an object");
  for (const auto& [key, value] : v.members)
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      safetensors_error(file, "tensor '", name, "' has an unknown field \"", key, "\"");
  const JsonValue* dtype = v.find("dtype");
  const JsonValue* shape = v.find("shape");
  const JsonValue* offsets = v.find("data_offsets");
  if (!dtype) safetensors_error(file, "tensor '", name, "' has no \"dtype\"");
  if (!shape) safetensors_error(file, "tensor '", name, "' has no \"shape\"");
  if (!offsets) safetensors_error(file, "tensor '", name, "' has no \"data_offsets\"");
  if (dtype->kind != JsonValue::Kind::String) safetensors_error(file, "tensor '", name, "': \"dtype\" is not a string");
  const auto d = parse_safetensors_dtype(dtype->string);
  if (!d) safetensors_error(file, "tensor '", name, "' has an unknown dtype \"", dtype->string, "\"");

  SafetensorsTensorInfo info{name, *d, {}, 1, 0, 0};
  if (shape->kind != JsonValue::Kind::Array) safetensors_error(file, "tensor '", name, "': \"shape\" is not an array");
  for (const JsonValue& e : shape->elements) {
    if (e.kind != JsonValue::Kind::Integer || e.integer < 0)
      safetensors_error(file, "tensor '", name, "': every extent of \"shape\" must be a non-negative integer");
    const auto n = checked_mul(info.numel, static_cast<std::uint64_t>(e.integer));
    if (!n) safetensors_error(file, "tensor '", name, "': the element count of its shape overflows 64 bits");
    info.numel = *n;
    info.shape.push_back(e.integer);
  }
  if (offsets->kind != JsonValue::Kind::Array || offsets->elements.size() != 2)
    safetensors_error(file, "tensor '", name, "': \"data_offsets\" must be an array of two integers");
  for (const JsonValue& e : offsets->elements)
    if (e.kind != JsonValue::Kind::Integer || e.integer < 0)
      safetensors_error(file, "tensor '", name, "': \"data_offsets\" must be non-negative integers");
  info.data_begin = static_cast<std::uint64_t>(offsets->elements[0].integer);
  info.data_end = static_cast<std::uint64_t>(offsets->elements[1].integer);
  if (info.data_end < info.data_begin)
    safetensors_error(file, "tensor '", name, "': data_offsets [", info.data_begin, ", ", info.data_end,
                      ") end before they begin");
  const auto bytes = checked_mul(info.numel, safetensors_dtype_size(*d));
  if (!bytes) safetensors_error(file, "tensor '", name, "': its byte size overflows 64 bits");
  if (info.data_end - info.data_begin != *bytes)
    safetensors_error(file, "tensor '", name, "': data_offsets [", info.data_begin, ", ", info.data_end, ") hold ",
                      info.data_end - info.data_begin, " bytes but ", info.numel, " elements of ", dtype->string,
                      " need ", *bytes);
  return info;
}

}  // namespace detail

/// Validates a safetensors header. `prefix` is the file's first 8 bytes (or fewer, when the file
/// is that short); `file_bytes` its total size. Returns the JSON length, after checking it is at
/// most safetensors_max_header_bytes and fits in the file: only then may a reader allocate it.
/// @param file  the file's name, quoted in every error
inline std::uint64_t validate_safetensors_prefix(std::string_view file, const unsigned char* prefix,
                                                 std::uint64_t file_bytes) {
  if (file_bytes < 8)
    detail::safetensors_error(file, "the file is ", file_bytes, " bytes, shorter than the 8-byte header length");
  const std::uint64_t n = detail::read_u64_le(prefix);
  if (n > safetensors_max_header_bytes)
    detail::safetensors_error(file, "header length ", n, " exceeds the limit of ", safetensors_max_header_bytes,
                              " bytes");
  if (n > file_bytes - 8)
    detail::safetensors_error(file, "header length ", n, " runs past the end of the file (", file_bytes, " bytes)");
  if (n == 0) detail::safetensors_error(file, "the header is empty (length 0)");
  return n;
}

/// Parses and validates the JSON header `json` of a file of `file_bytes` bytes: well-formed
/// strict JSON, known dtypes, non-negative shapes, byte sizes equal to element count times
/// dtype size (overflow-checked), data offsets contiguous from 0 and covering the data section
/// exactly (so none overlap and none reach past the end), no duplicate names, and an optional
/// "__metadata__" object of strings. Throws polyshard::Error naming `file` and the fault.
inline SafetensorsHeader parse_safetensors_header(std::string_view file, std::string_view json,
                                                  std::uint64_t file_bytes) {
  SafetensorsHeader h;
  h.header_bytes = json.size();
  h.file_bytes = file_bytes;
  if (json.empty() || json.front() != '{')
    detail::safetensors_error(file, "the header does not start with '{'");
  JsonValue root;
  try {
    // Depth 3 suffices for the format, and arrays hold a shape or two offsets; a little more
    // lets the error say what was wrong.
    root = parse_json(json, 8, safetensors_max_rank);
  } catch (const Error& e) {
    detail::safetensors_error(file, "header: ", e.what());
  }
  if (root.kind != JsonValue::Kind::Object) detail::safetensors_error(file, "the header is not a JSON object");

  const std::uint64_t data_start = 8 + json.size();
  if (file_bytes < data_start) detail::safetensors_error(file, "the header runs past the end of the file");
  const std::uint64_t data_bytes = file_bytes - data_start;
  for (const auto& [name, value] : root.members) {
    if (name == "__metadata__") {
      if (value.kind != JsonValue::Kind::Object)
        detail::safetensors_error(file, "\"__metadata__\" is ", json_kind_name(value.kind), ", not an object");
      for (const auto& [key, v] : value.members) {
        if (v.kind != JsonValue::Kind::String)
          detail::safetensors_error(file, "metadata \"", key, "\" is ", json_kind_name(v.kind), ", not a string");
        h.metadata.emplace_back(key, v.string);
      }
      continue;
    }
    if (name.empty()) detail::safetensors_error(file, "a tensor has an empty name");
    h.tensors.push_back(detail::parse_tensor_entry(file, name, value));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  std::uint64_t expected = 0;
  for (const auto& t : h.tensors) {
    if (t.data_begin != expected) {
      if (t.data_begin < expected)
        detail::safetensors_error(file, "tensor '", t.name, "' at data_offsets [", t.data_begin, ", ", t.data_end,
                                  ") overlaps the tensor before it (which ends at ", expected, ")");
      detail::safetensors_error(file, "tensor '", t.name, "' starts at ", t.data_begin,
                                " but the previous tensor ends at ", expected,
                                ": data offsets must be contiguous from 0");
    }
    if (t.data_end > data_bytes)
      detail::safetensors_error(file, "tensor '", t.name, "' at data_offsets [", t.data_begin, ", ", t.data_end,
                                ") runs past the end of the data (", data_bytes, " bytes)");
    expected = t.data_end;
  }
  if (expected != data_bytes)
    detail::safetensors_error(file, "the tensors cover ", expected, " bytes of data but the file holds ", data_bytes,
                              " (trailing bytes or a missing tensor)");
  for (auto& t : h.tensors) {
    t.data_begin += data_start;
    t.data_end += data_start;
  }
  return h;
}

}  // namespace polyshard
