// Writes the fuzzer's seed corpus: the valid and malformed files the Catch2 tests check, so
// fuzzing starts from well-formed structure instead of random bytes.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "io/malformed_corpus.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_seed_corpus DIR\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  auto files = polyshard::test::valid_safetensors_corpus();
  for (auto& f : polyshard::test::malformed_safetensors_corpus()) files.push_back(std::move(f));
  for (std::size_t i = 0; i < files.size(); ++i) {
    std::ofstream out(dir / ("seed-" + std::to_string(i)), std::ios::binary);
    out.write(reinterpret_cast<const char*>(files[i].bytes.data()), static_cast<std::streamsize>(files[i].bytes.size()));
  }
  return 0;
}
