// The byte-level tokenizer: every byte of a text is one token (vocabulary 256), so any file
// is a valid corpus and decoding is exact.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace polyshard {

struct ByteTokenizer {
  static constexpr std::int64_t vocab_size = 256;

  static std::vector<std::int32_t> encode(std::string_view text) {
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  static std::string decode(std::span<const std::int32_t> ids) {
    std::string text(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    return text;
  }
};

}  // namespace polyshard
