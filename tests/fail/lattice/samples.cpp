// Prints the compositions of the policy lattice that tests/fail/lattice checks, one per line as
// "<index>\t<sentence>": for each sentence of the predicate, the first and the last composition it
// rejects (the sentence must then be in the compiler's output), and the first and last valid
// composition with an empty sentence (they must compile); then rejected compositions drawn from
// the seed given as the first argument until at least kRejected are listed, and kDrawnValid valid
// ones. CI seeds it with the commit, so each commit checks another sample and, over commits,
// every sentence's region of the lattice is visited.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "support/policy_covering.hpp"

namespace {
constexpr std::size_t kRejected = 32;
constexpr std::size_t kDrawnValid = 2;
}  // namespace

int main(int argc, char** argv) {
  namespace lattice = polyshard::test::lattice;
  const std::uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  std::map<std::string_view, std::pair<std::size_t, std::size_t>> first_last;
  for (std::size_t k = 0; k < lattice::kCompositions; ++k) {
    const auto [it, inserted] = first_last.try_emplace(lattice::kErrors[k], k, k);
    it->second.second = k;
  }
  std::set<std::size_t> listed;
  std::size_t rejected = 0;
  const auto list = [&](std::size_t k) {
    if (!listed.insert(k).second) return;
    const std::string_view sentence = lattice::kErrors[k];
    rejected += !sentence.empty();
    std::printf("%zu\t%.*s\n", k, int(sentence.size()), sentence.data());
  };
  for (const auto& [sentence, ks] : first_last) {
    list(ks.first);
    list(ks.second);
  }
  std::vector<std::size_t> invalid, valid;
  for (std::size_t k = 0; k < lattice::kCompositions; ++k)
    (lattice::kErrors[k].empty() ? valid : invalid).push_back(k);
  // Draw from the compositions not listed yet, so that the sample reaches its size.
  std::mt19937_64 draw(seed);
  std::shuffle(invalid.begin(), invalid.end(), draw);
  std::shuffle(valid.begin(), valid.end(), draw);
  for (std::size_t i = 0; i < invalid.size() && rejected < kRejected; ++i) list(invalid[i]);
  for (std::size_t i = 0, drawn = 0; i < valid.size() && drawn < kDrawnValid; ++i)
    if (!listed.count(valid[i])) {
      list(valid[i]);
      ++drawn;
    }
}
