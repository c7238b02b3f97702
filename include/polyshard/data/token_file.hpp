// Token files, the training data of models with a real tokenizer: nanoGPT's (a flat array of
// uint16 token ids, prepare.py's train.bin) and llm.c's (a header of 256 int32 with its magic
// number, version and token count, then uint16 token ids); and text, tokenized as bytes.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/core/read_file.hpp"
#include "polyshard/data/byte_tokenizer.hpp"
#include "polyshard/data/text_dataset.hpp"

namespace polyshard {

enum class TokenFormat { text, nanogpt, llmc };

/// llm.c's header: 256 little-endian int32, [0] the magic number, [1] the version (1: uint16
/// token ids, GPT-2's), [2] the number of tokens that follow.
inline constexpr std::int32_t llmc_magic = 20240520;
inline constexpr std::int32_t llmc_version = 1;
inline constexpr std::size_t llmc_header_bytes = 256 * sizeof(std::int32_t);

/// GPT-2's vocabulary, the default for token files; bytes have ByteTokenizer::vocab_size.
inline constexpr std::int64_t gpt2_vocab_size = 50257;

inline const char* token_format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::text: return "text";
    case TokenFormat::nanogpt: return "nanogpt";
    case TokenFormat::llmc: return "llmc";
  }
  return "?";
}

/// "text", "nanogpt" or "llmc"; anything else is an error naming the value.
inline TokenFormat parse_token_format(std::string_view name) {
  if (name == "text") return TokenFormat::text;
  if (name == "nanogpt") return TokenFormat::nanogpt;
  if (name == "llmc") return TokenFormat::llmc;
  throw Error("unknown token file format '" + std::string(name) + "' (text, nanogpt or llmc)");
}

namespace detail {
inline std::int32_t int32_at(const std::string& bytes, std::size_t index) {
  std::int32_t v;
  std::memcpy(&v, bytes.data() + index * sizeof v, sizeof v);  // little-endian, as the files are
  return v;
}

/// The uint16 token ids of bytes[begin, end), each checked to be below `vocab_size`; errors name
/// the file, the token's byte offset and its value.
inline std::vector<std::int32_t> uint16_tokens(const std::string& bytes, std::size_t begin, const std::string& path,
                                               std::int64_t vocab_size) {
  POLYSHARD_CHECK((bytes.size() - begin) % 2 == 0, "token file '", path, "': ", bytes.size() - begin,
                  " bytes of tokens are not a whole number of uint16 ids");
  std::vector<std::int32_t> tokens((bytes.size() - begin) / 2);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::uint16_t id;
    std::memcpy(&id, bytes.data() + begin + 2 * i, sizeof id);
    POLYSHARD_CHECK(id < vocab_size, "token file '", path, "': token ", id, " at byte offset ", begin + 2 * i,
                    " is not below the vocabulary size ", vocab_size);
    tokens[i] = id;
  }
  return tokens;
}
}  // namespace detail

/// The format of `path` from its content: llm.c's magic number in the first four bytes (of a
/// file long enough for the header), else nanoGPT's for a name ending in ".bin", else text.
inline TokenFormat detect_token_format(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  POLYSHARD_CHECK(in.good(), "token file: cannot open '", path, "'");
  std::array<char, 4> head{};
  in.read(head.data(), head.size());
  std::int32_t magic = 0;
  if (in.gcount() == 4) std::memcpy(&magic, head.data(), sizeof magic);
  if (magic == llmc_magic) return TokenFormat::llmc;
  const bool bin = path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  return bin ? TokenFormat::nanogpt : TokenFormat::text;
}

/// Reads `path` as `format`: text byte-tokenized, or a token file's uint16 ids, every id checked
/// against `vocab_size` (an error names the file, the byte offset and the value). An llm.c
/// file's magic number, version and token count are checked against its header.
inline TextDataset read_token_file(const std::string& path, TokenFormat format, std::int64_t vocab_size) {
  POLYSHARD_CHECK(vocab_size >= 1, "token file '", path, "': the vocabulary size must be positive, got ", vocab_size);
  if (format == TokenFormat::text) {
    POLYSHARD_CHECK(vocab_size >= ByteTokenizer::vocab_size, "token file '", path, "': text is tokenized as bytes, ",
                    "which needs a vocabulary of ", ByteTokenizer::vocab_size, ", not ", vocab_size);
    return TextDataset::from_file(path);
  }
  const std::string bytes = read_file(path, "token file");
  if (format == TokenFormat::nanogpt) return TextDataset(detail::uint16_tokens(bytes, 0, path, vocab_size), path);
  POLYSHARD_CHECK(bytes.size() >= llmc_header_bytes, "token file '", path, "': ", bytes.size(),
                  " bytes are too few for llm.c's header of 256 int32");
  const std::int32_t magic = detail::int32_at(bytes, 0), version = detail::int32_at(bytes, 1);
  const std::int32_t count = detail::int32_at(bytes, 2);
  POLYSHARD_CHECK(magic == llmc_magic, "token file '", path, "': magic number ", magic, ", not llm.c's ", llmc_magic);
  POLYSHARD_CHECK(version == llmc_version, "token file '", path, "': llm.c version ", version,
                  " is not read here (version ", llmc_version, ": uint16 token ids)");
  const std::size_t held = (bytes.size() - llmc_header_bytes) / 2;
  POLYSHARD_CHECK(count >= 0 && static_cast<std::size_t>(count) == held && (bytes.size() - llmc_header_bytes) % 2 == 0,
                  "token file '", path, "': the header counts ", count, " tokens, the file holds ",
                  bytes.size() - llmc_header_bytes, " bytes after it");
  return TextDataset(detail::uint16_tokens(bytes, llmc_header_bytes, path, vocab_size), path);
}

}  // namespace polyshard
