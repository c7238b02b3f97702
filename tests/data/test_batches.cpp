// Tokenizer, dataset windows and deterministic, rank-split batches.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

#include "polyshard/data/data.hpp"

using namespace polyshard;

TEST_CASE("byte tokenizer round-trips any bytes", "[data]") {
  std::string text = "héllo\n\x01\xff";
  auto ids = ByteTokenizer::encode(text);
  CHECK(ids.size() == text.size());
  for (auto id : ids) CHECK((0 <= id && id < 256));
  CHECK(ByteTokenizer::decode(ids) == text);
}

TEST_CASE("a file of exactly one window is valid, a shorter one is an error", "[data]") {
  const std::string path = "polyshard_test_window.txt";
  {
    std::ofstream(path) << "abcdefghi";  // 9 bytes: one window of 8
  }
  auto data = TextDataset::from_file(path);
  CHECK(data.windows(8) == 1);
  BatchSampler sampler(data, 8, 3, 1);
  auto b = sampler.batch(5);
  CHECK(ByteTokenizer::decode(b.inputs.span().subspan(0, 8)) == "abcdefgh");
  CHECK(ByteTokenizer::decode(b.targets.span().subspan(0, 8)) == "bcdefghi");
  CHECK_THROWS_WITH(data.windows(9), Catch::Contains("holds 9 tokens") && Catch::Contains("needs 10"));
  std::remove(path.c_str());
  CHECK_THROWS_WITH(TextDataset::from_file("/nonexistent/corpus.txt"), Catch::Contains("/nonexistent/corpus.txt"));
}

TEST_CASE("every world size sees the same global batch, split by rank", "[data]") {
  const TextDataset data = TextDataset::from_text(builtin_corpus(1 << 14), "corpus");
  BatchSampler sampler(data, 16, 10, 7);
  const auto whole = sampler.batch(3).inputs.to_vector();
  for (int world = 1; world <= 4; ++world) {
    std::vector<std::int32_t> joined;
    for (int rank = 0; rank < world; ++rank) {
      auto part = sampler.batch(3, rank, world).inputs.to_vector();
      joined.insert(joined.end(), part.begin(), part.end());
    }
    CHECK(joined == whole);
  }
  CHECK(sampler.batch(3).inputs.to_vector() == whole);   // repeatable
  CHECK(sampler.batch(4).inputs.to_vector() != whole);   // and different per step
  CHECK(rank_rows(10, 3, 4).begin == 8);
  CHECK(rank_rows(10, 3, 4).end == 10);
}

TEST_CASE("the built-in corpus is deterministic text", "[data]") {
  const std::string a = builtin_corpus(5000), b = builtin_corpus(5000);
  CHECK(a == b);
  CHECK(a.size() == 5000);
  CHECK(a.find(". ") == std::string::npos);  // one sentence per line
  CHECK(a.find(".\n") != std::string::npos);
}
