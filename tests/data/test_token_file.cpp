// Token files as nanoGPT and llm.c write them, read back token for token; the format detected
// from the header; every malformed file an error naming the file and what is wrong.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "polyshard/data/data.hpp"
#include "polyshard/data/token_file.hpp"

using namespace polyshard;

namespace {
/// Writes raw little-endian words: int32 header words then uint16 token ids.
void write_file(const std::string& path, const std::vector<std::int32_t>& header, const std::vector<std::uint16_t>& ids) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), std::streamsize(header.size() * sizeof(std::int32_t)));
  out.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * sizeof(std::uint16_t)));
}

/// llm.c's header for `count` tokens: magic, version, count, then zeros to 256 words.
std::vector<std::int32_t> llmc_header(std::int32_t count, std::int32_t magic = llmc_magic,
                                      std::int32_t version = llmc_version) {
  std::vector<std::int32_t> h(256, 0);
  h[0] = magic;
  h[1] = version;
  h[2] = count;
  return h;
}

const std::vector<std::uint16_t> kIds = {50256, 15496, 11, 995, 0, 13, 50256, 40};
}  // namespace

TEST_CASE("nanoGPT and llm.c token files read back every id, the format detected from the header", "[data]") {
  write_file("polyshard_test_tokens.bin", {}, kIds);
  write_file("polyshard_test_llmc.bin", llmc_header(std::int32_t(kIds.size())), kIds);
  {
    std::ofstream("polyshard_test_tokens.txt") << "abc";
  }
  CHECK(detect_token_format("polyshard_test_tokens.bin") == TokenFormat::nanogpt);
  CHECK(detect_token_format("polyshard_test_llmc.bin") == TokenFormat::llmc);
  CHECK(detect_token_format("polyshard_test_tokens.txt") == TokenFormat::text);
  for (const auto& [path, format] : {std::pair{"polyshard_test_tokens.bin", TokenFormat::nanogpt},
                                     std::pair{"polyshard_test_llmc.bin", TokenFormat::llmc}}) {
    const TextDataset data = read_token_file(path, format, gpt2_vocab_size);
    REQUIRE(data.size() == std::int64_t(kIds.size()));
    for (std::size_t i = 0; i < kIds.size(); ++i) CHECK(data.tokens()[i] == kIds[i]);
    CHECK(data.origin() == path);
    // Windows and batches as from text: the targets are the inputs shifted by one token.
    const Batch b = BatchSampler(data, 7, 1, 3).batch(0);
    CHECK(b.inputs.data()[0] == 50256);
    CHECK(b.targets.data()[6] == 40);
  }
  const TextDataset text = read_token_file("polyshard_test_tokens.txt", TokenFormat::text, 256);
  CHECK(text.tokens() == std::vector<std::int32_t>{'a', 'b', 'c'});
  CHECK(parse_token_format("llmc") == TokenFormat::llmc);
  CHECK_THROWS_WITH(parse_token_format("npy"), Catch::Contains("'npy'") && Catch::Contains("nanogpt"));
  for (const char* p : {"polyshard_test_tokens.bin", "polyshard_test_llmc.bin", "polyshard_test_tokens.txt"}) std::remove(p);
}

TEST_CASE("a token at or above the vocabulary is an error naming the file, the byte offset and the value", "[data]") {
  write_file("polyshard_test_vocab.bin", {}, kIds);
  // 50256 at byte offset 0 is GPT-2's <|endoftext|>: within 50257, not within 50000.
  CHECK_THROWS_WITH(read_token_file("polyshard_test_vocab.bin", TokenFormat::nanogpt, 50000),
                    Catch::Contains("polyshard_test_vocab.bin") && Catch::Contains("token 50256 at byte offset 0") &&
                        Catch::Contains("vocabulary size 50000"));
  write_file("polyshard_test_vocab.bin", llmc_header(3), {1, 2, 300});
  CHECK_THROWS_WITH(read_token_file("polyshard_test_vocab.bin", TokenFormat::llmc, 256),
                    Catch::Contains("token 300 at byte offset 1028"));
  CHECK_THROWS_WITH(read_token_file("polyshard_test_vocab.bin", TokenFormat::text, 100),
                    Catch::Contains("vocabulary of 256"));
  std::remove("polyshard_test_vocab.bin");
}

TEST_CASE("malformed token files are errors that say what is wrong", "[data]") {
  const std::string path = "polyshard_test_bad.bin";
  {
    std::ofstream(path, std::ios::binary) << "abc";  // 3 bytes: no whole uint16
  }
  CHECK_THROWS_WITH(read_token_file(path, TokenFormat::nanogpt, 256), Catch::Contains("not a whole number of uint16"));
  CHECK_THROWS_WITH(read_token_file(path, TokenFormat::llmc, 256), Catch::Contains("too few for llm.c's header"));
  write_file(path, llmc_header(2, 12345), {1, 2});
  CHECK_THROWS_WITH(read_token_file(path, TokenFormat::llmc, 256), Catch::Contains("magic number 12345"));
  write_file(path, llmc_header(2, llmc_magic, 2), {1, 2});
  CHECK_THROWS_WITH(read_token_file(path, TokenFormat::llmc, 256), Catch::Contains("llm.c version 2"));
  write_file(path, llmc_header(5), {1, 2});
  CHECK_THROWS_WITH(read_token_file(path, TokenFormat::llmc, 256),
                    Catch::Contains("counts 5 tokens") && Catch::Contains("holds 4 bytes"));
  // A file too short for one window is the dataset's error, naming the file.
  write_file(path, {}, {1, 2, 3});
  CHECK_THROWS_WITH(read_token_file(path, TokenFormat::nanogpt, 256).windows(3),
                    Catch::Contains(path) && Catch::Contains("holds 3 tokens"));
  CHECK_THROWS_WITH(read_token_file("polyshard_no_such_file.bin", TokenFormat::nanogpt, 256), Catch::Contains("cannot open"));
  std::remove(path.c_str());
}
