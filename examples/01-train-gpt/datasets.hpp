// The data a polyshard-train run reads: its training set and, with --val-data, a validation set.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "polyshard/data/byte_tokenizer.hpp"
#include "polyshard/data/text_dataset.hpp"

namespace train {

struct Datasets {
  polyshard::TextDataset train;
  std::optional<polyshard::TextDataset> validation;  // --val-data
  std::vector<std::int32_t> prompt = {};             // what --sample-every continues, as tokens
  bool bytes = true;                                 // tokens are bytes (text), not a tokenizer's ids
};

/// --prompt as tokens: its bytes for text, else ids separated by commas or spaces, each checked
/// against the vocabulary; empty: the training set's first token.
inline std::vector<std::int32_t> prompt_tokens(const std::string& prompt, bool bytes, std::int64_t vocab,
                                               const polyshard::TextDataset& train) {
  if (prompt.empty()) return {train.tokens()[0]};
  if (bytes) return polyshard::ByteTokenizer::encode(prompt);
  std::vector<std::int32_t> ids;
  std::string id;
  auto flush = [&] {
    if (id.empty()) return;
    std::size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(id, &used);
    } catch (const std::exception&) {
    }
    POLYSHARD_CHECK(used == id.size() && value >= 0 && value < vocab, "polyshard-train: --prompt '", prompt,
                    "': '", id, "' is not a token id below the vocabulary size ", vocab);
    ids.push_back(static_cast<std::int32_t>(value));
    id.clear();
  };
  for (const char c : prompt) {
    if (c == ',' || c == ' ') flush();
    else id += c;
  }
  flush();
  POLYSHARD_CHECK(!ids.empty(), "polyshard-train: --prompt '", prompt, "' holds no token ids");
  return ids;
}

}  // namespace train
