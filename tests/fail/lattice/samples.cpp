// Prints the compositions of the policy lattice that tests/fail/lattice checks, one per line as
// "<index>\t<sentence>": for each sentence of the predicate, the first and the last composition it
// rejects (the sentence must then be in the compiler's output), and the first and last valid
// composition with an empty sentence (they must compile).
#include <cstdio>
#include <map>
#include <string_view>
#include <utility>

#include "support/policy_covering.hpp"

int main() {
  namespace lattice = polyshard::test::lattice;
  std::map<std::string_view, std::pair<std::size_t, std::size_t>> first_last;
  for (std::size_t k = 0; k < lattice::kCompositions; ++k) {
    const auto [it, inserted] = first_last.try_emplace(lattice::kErrors[k], k, k);
    it->second.second = k;
  }
  for (const auto& [sentence, ks] : first_last) {
    std::printf("%zu\t%.*s\n", ks.first, int(sentence.size()), sentence.data());
    if (ks.second != ks.first) std::printf("%zu\t%.*s\n", ks.second, int(sentence.size()), sentence.data());
  }
}
