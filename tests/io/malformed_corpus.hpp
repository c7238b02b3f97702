// Hostile safetensors files, one per lie a file can tell, each with the error it must produce;
// shared by the Catch2 tests (which check the errors) and the fuzzer's seed corpus.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "polyshard/io/safetensors_writer.hpp"

namespace polyshard::test {

struct CorpusFile {
  std::string name;          ///< what the file lies about (also its file name, with '_' for ' ')
  std::vector<std::byte> bytes;
  std::string error;         ///< a phrase the reader's error must contain
};

inline std::vector<std::byte> raw(std::string_view s) {
  std::vector<std::byte> out;
  for (char c : s) out.push_back(static_cast<std::byte>(c));
  return out;
}

/// An 8-byte little-endian length `declared` (by default the header's true length), the header
/// text, then `data_bytes` bytes of data.
inline std::vector<std::byte> safetensors_bytes(std::string_view header, std::uint64_t data_bytes,
                                                std::optional<std::uint64_t> declared = std::nullopt) {
  std::uint64_t n = declared.value_or(header.size());
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i, n >>= 8) out.push_back(static_cast<std::byte>(n & 0xff));
  const auto h = raw(header);
  out.insert(out.end(), h.begin(), h.end());
  for (std::uint64_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<std::byte>(i * 37 + 11));
  return out;
}

/// Valid files: a few dtypes, metadata, a scalar and an empty tensor.
inline std::vector<CorpusFile> valid_safetensors_corpus() {
  std::vector<CorpusFile> out;
  SafetensorsWriter w;
  w.add("weight", Tensor<float>::from({2, 3}, {1, 2, 3, 4, 5, 6}));
  w.add("bias", Tensor<bfloat16>::full({3}, bfloat16(0.5f)));
  w.add("step", Tensor<std::int64_t>::full({}, 7));
  w.add("empty", Tensor<double>::zeros({0, 4}));
  w.add_metadata("format", "pt");
  out.push_back({"mixed dtypes", w.to_bytes(), ""});
  out.push_back({"metadata only", safetensors_bytes(R"({"__metadata__":{"a":"b\u00e9\ud83d\ude00"}})", 0), ""});
  out.push_back({"padded header", safetensors_bytes(R"({"x":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}      )", 4), ""});
  return out;
}

/// Files that lie, and the phrase of the error each must raise.
inline std::vector<CorpusFile> malformed_safetensors_corpus() {
  const std::string t16 = R"("dtype":"F32","shape":[2,2],"data_offsets":[0,16])";
  auto one = [](const std::string& entry) { return "{\"t\":{" + entry + "}}"; };
  auto ones = [](int n) {  // "1,1,...,1"
    std::string s = "1";
    for (int i = 1; i < n; ++i) s += ",1";
    return s;
  };
  std::vector<CorpusFile> c = {
      {"empty file", {}, "shorter than the 8-byte header length"},
      {"truncated length", raw(std::string_view("\x10\0\0\0\0", 5)), "shorter than the 8-byte header length"},
      {"huge header length", safetensors_bytes("{}", 0, std::uint64_t(1) << 63), "exceeds the limit of 100000000"},
      {"header length just over the limit", safetensors_bytes("{}", 0, 100'000'001), "exceeds the limit"},
      {"header length past the end", safetensors_bytes("{}      ", 0, 4096), "runs past the end of the file"},
      {"zero header length", safetensors_bytes("", 0, 0), "header is empty"},
      {"header not an object", safetensors_bytes("[1, 2]  ", 0), "does not start with '{'"},
      {"unclosed object", safetensors_bytes(R"({"t":{"dtype":"F32")", 0), "invalid JSON"},
      {"trailing garbage", safetensors_bytes("{} x", 0), "expected end of input"},
      {"NUL padding", safetensors_bytes(std::string("{}\0\0\0\0\0\0", 8), 0), "a NUL byte"},
      {"unknown escape", safetensors_bytes(R"({"a\q":{}})", 0), "forbidden character after backslash"},
      {"lone high surrogate escape", safetensors_bytes(R"({"\ud800x":{}})", 0), "must be followed by U+DC00..U+DFFF"},
      {"lone low surrogate escape", safetensors_bytes(R"({"\udc00":{}})", 0), "must follow U+D800..U+DBFF"},
      {"short unicode escape", safetensors_bytes(R"({"\u12":{}})", 0), "must be followed by 4 hex digits"},
      {"invalid UTF-8 byte", safetensors_bytes("{\"\xff\":{}}", 0), "ill-formed UTF-8 byte"},
      {"overlong UTF-8", safetensors_bytes("{\"\xe0\x80\x80\":{}}", 0), "ill-formed UTF-8 byte"},
      {"truncated UTF-8", safetensors_bytes("{\"\xe2\x82", 0), "UTF-8"},
      {"control character in a name", safetensors_bytes("{\"a\nb\":{}}", 0), "control character"},
      {"true instead of a value", safetensors_bytes(R"({"t":true})", 0), "true, false and null"},
      {"leading zeros", safetensors_bytes(R"({"t":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}})", 8),
       "unexpected number literal"},
      {"integer beyond 64 bits",
       safetensors_bytes(R"({"t":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}})", 4),
       "does not fit in 64 bits"},
      {"fractional extent", safetensors_bytes(R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
       "only integers"},
      {"deep nesting", safetensors_bytes("{\"t\":" + std::string(40, '[') + std::string(40, ']') + "}", 0),
       "nested deeper"},
      {"shape of 2000 dimensions", safetensors_bytes(one(R"("dtype":"F32","shape":[)" + ones(2000) + R"(],"data_offsets":[0,4])"), 4),
       "array longer than 1024 elements"},
      {"unknown dtype", safetensors_bytes(one(R"("dtype":"F33","shape":[2,2],"data_offsets":[0,16])"), 16),
       "unknown dtype \"F33\""},
      {"lowercase dtype", safetensors_bytes(one(R"("dtype":"f32","shape":[2,2],"data_offsets":[0,16])"), 16),
       "unknown dtype"},
      {"dtype not a string", safetensors_bytes(one(R"("dtype":4,"shape":[2,2],"data_offsets":[0,16])"), 16),
       "\"dtype\" is not a string"},
      {"negative extent", safetensors_bytes(one(R"("dtype":"F32","shape":[-2,2],"data_offsets":[0,16])"), 16),
       "non-negative integer"},
      {"shape not an array", safetensors_bytes(one(R"("dtype":"F32","shape":"2x2","data_offsets":[0,16])"), 16),
       "\"shape\" is not an array"},
      {"element count overflow",
       safetensors_bytes(one(R"("dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16])"), 16),
       "element count of its shape overflows"},
      {"byte size overflow",
       safetensors_bytes(one(R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,16])"), 16),
       "byte size overflows"},
      {"size does not match the shape", safetensors_bytes(one(R"("dtype":"F32","shape":[2,2],"data_offsets":[0,12])"), 12),
       "hold 12 bytes but 4 elements of F32 need 16"},
      {"offsets end before they begin", safetensors_bytes(one(R"("dtype":"F32","shape":[0],"data_offsets":[16,0])"), 16),
       "end before they begin"},
      {"three offsets", safetensors_bytes(one(R"("dtype":"F32","shape":[1],"data_offsets":[0,4,8])"), 8),
       "array of two integers"},
      {"negative offset", safetensors_bytes(one(R"("dtype":"F32","shape":[1],"data_offsets":[-4,0])"), 8),
       "non-negative integers"},
      {"missing data_offsets", safetensors_bytes(one(R"("dtype":"F32","shape":[2,2])"), 16), "has no \"data_offsets\""},
      {"missing dtype", safetensors_bytes(one(R"("shape":[2,2],"data_offsets":[0,16])"), 16), "has no \"dtype\""},
      {"unknown field", safetensors_bytes(one(t16 + R"(,"offset":3)"), 16), "unknown field \"offset\""},
      {"entry not an object", safetensors_bytes(R"({"t":[1,2]})", 0), "not an object"},
      {"offsets past the end of the file", safetensors_bytes(one(t16), 8), "runs past the end of the data (8 bytes)"},
      {"overlapping offsets",
       safetensors_bytes("{\"a\":{" + t16 + R"(},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 24),
       "overlaps the tensor before it"},
      {"same offsets twice",
       safetensors_bytes("{\"a\":{" + t16 + R"(},"b":{"dtype":"I32","shape":[4],"data_offsets":[0,16]}})", 32),
       "overlaps"},
      {"gap between tensors",
       safetensors_bytes("{\"a\":{" + t16 + R"(},"b":{"dtype":"F32","shape":[4],"data_offsets":[20,36]}})", 36),
       "must be contiguous from 0"},
      {"data not starting at 0", safetensors_bytes(one(R"("dtype":"F32","shape":[4],"data_offsets":[4,20])"), 20),
       "must be contiguous from 0"},
      {"trailing bytes", safetensors_bytes(one(t16), 24), "trailing bytes"},
      {"duplicate names", safetensors_bytes("{\"t\":{" + t16 + "},\"t\":{" + t16 + "}}", 16), "duplicate name \"t\""},
      {"empty name", safetensors_bytes("{\"\":{" + t16 + "}}", 16), "empty name"},
      {"metadata not an object", safetensors_bytes(R"({"__metadata__":"pt"})", 0), "\"__metadata__\" is a string"},
      {"metadata value not a string", safetensors_bytes(R"({"__metadata__":{"format":1}})", 0),
       "metadata \"format\" is an integer, not a string"},
  };
  // A valid file cut short: the data no longer holds what the header promises.
  std::vector<std::byte> whole = valid_safetensors_corpus()[0].bytes;
  whole.resize(whole.size() - 4);
  c.push_back({"truncated data", whole, "runs past the end of the data"});
  std::vector<std::byte> cut = valid_safetensors_corpus()[0].bytes;
  cut.resize(20);
  c.push_back({"truncated header", cut, "runs past the end of the file"});
  return c;
}

}  // namespace polyshard::test
