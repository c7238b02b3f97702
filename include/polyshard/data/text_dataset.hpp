// A tokenized text held in memory, with the training windows it offers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/core/read_file.hpp"
#include "polyshard/data/byte_tokenizer.hpp"

namespace polyshard {

/// Token ids of a whole text. A window of `seq_len` inputs needs seq_len + 1 tokens (its
/// targets are the inputs shifted by one), so a text of n tokens offers n - seq_len windows.
class TextDataset {
 public:
  explicit TextDataset(std::vector<std::int32_t> tokens, std::string origin = "<memory>")
      : tokens_(std::move(tokens)), origin_(std::move(origin)) {}

  static TextDataset from_text(std::string_view text, std::string origin = "<memory>") {
    return TextDataset(ByteTokenizer::encode(text), std::move(origin));
  }

  /// Reads and byte-tokenizes a file; an unreadable file is an error naming it.
  static TextDataset from_file(const std::string& path) {
    return from_text(read_file(path, "TextDataset"), path);
  }

  const std::vector<std::int32_t>& tokens() const { return tokens_; }
  const std::string& origin() const { return origin_; }
  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }

  /// Number of distinct windows of `seq_len` inputs; throws when the text is too short for one.
  std::int64_t windows(std::int64_t seq_len) const {
    POLYSHARD_CHECK(seq_len >= 1, "TextDataset: sequence length must be at least 1, got ", seq_len);
    POLYSHARD_CHECK(size() >= seq_len + 1, "TextDataset: '", origin_, "' holds ", size(),
                    " tokens, but a training window of sequence length ", seq_len, " needs ", seq_len + 1);
    return size() - seq_len;
  }

 private:
  std::vector<std::int32_t> tokens_;
  std::string origin_;
};

}  // namespace polyshard
