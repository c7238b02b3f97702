// A strength-2 covering subset of the policy lattice's valid compositions, generated at compile
// time from the predicate (policy_lattice.hpp): the compositions the engine tests train. Apart
// from the lattice because the generation costs seconds of constant evaluation in every
// translation unit that includes it.
#pragma once

#include "support/policy_lattice.hpp"

namespace polyshard::test::lattice {

/// The predicate's verdict on every composition, by index.
inline constexpr std::array<std::string_view, kCompositions> kErrors =
    []<std::size_t... K>(std::index_sequence<K...>) {
      return std::array<std::string_view, kCompositions>{composition<K>::error...};
    }(std::make_index_sequence<kCompositions>());

constexpr std::size_t count_valid() {
  std::size_t n = 0;
  for (const auto& e : kErrors) n += e.empty();
  return n;
}
inline constexpr std::size_t kValid = count_valid();

/// Pairs of members of two families, numbered: family pair (f, g), f < g, member a of f and b of g.
struct PairIndex {
  std::array<std::array<std::size_t, kFamilies>, kFamilies> offset{};
  std::size_t total = 0;
  constexpr PairIndex() {
    for (std::size_t f = 0; f < kFamilies; ++f)
      for (std::size_t g = f + 1; g < kFamilies; ++g) {
        offset[f][g] = total;
        total += kSizes[f] * kSizes[g];
      }
  }
  constexpr std::size_t of(std::size_t f, std::size_t a, std::size_t g, std::size_t b) const {
    return offset[f][g] + a * kSizes[g] + b;
  }
};
inline constexpr PairIndex kPairs{};
inline constexpr std::size_t kMaxCovering = 64;

/// A strength-2 covering array of the valid compositions: every pair of members of two families
/// that some valid composition holds is held by at least one chosen composition. Greedy: each
/// round takes the valid composition that holds the most pairs not yet held (the lowest index on
/// a tie), so the subset is a function of the lattice and the predicate alone.
struct Covering {
  std::array<std::size_t, kMaxCovering> picks{};
  std::size_t size = 0;
  std::size_t coverable_pairs = 0;  // pairs held by some valid composition
};

constexpr Covering make_covering() {
  constexpr std::size_t kPairsPer = kFamilies * (kFamilies - 1) / 2;
  // The pairs each valid composition holds, computed once: the greedy rounds only look them up.
  std::array<std::size_t, kValid> valid{};
  std::array<std::array<std::size_t, kPairsPer>, kValid> pairs{};
  for (std::size_t k = 0, v = 0; k < kCompositions; ++k) {
    if (!kErrors[k].empty()) continue;
    const auto m = members_of(k);
    std::size_t i = 0;
    for (std::size_t f = 0; f < kFamilies; ++f)
      for (std::size_t g = f + 1; g < kFamilies; ++g) pairs[v][i++] = kPairs.of(f, m[f], g, m[g]);
    valid[v++] = k;
  }
  std::array<bool, kPairs.total> coverable{}, covered{};
  for (const auto& held : pairs)
    for (std::size_t p : held) coverable[p] = true;
  Covering out;
  for (bool c : coverable) out.coverable_pairs += c;
  // A composition's gain only falls from round to round, so the last one computed bounds it: one
  // whose bound cannot beat the best gain of this round so far is not recounted (the picks are
  // those of counting every one, in a fraction of the constant evaluation's steps).
  std::array<std::size_t, kValid> bound{};
  bound.fill(kPairsPer);
  for (std::size_t left = out.coverable_pairs; left > 0;) {
    std::size_t best = kValid, best_gain = 0;
    for (std::size_t v = 0; v < kValid; ++v) {
      if (bound[v] <= best_gain) continue;
      std::size_t gain = 0;
      for (std::size_t p : pairs[v]) gain += !covered[p];
      bound[v] = gain;
      if (gain > best_gain) best = v, best_gain = gain;
    }
    if (best == kValid || out.size == kMaxCovering) throw "make_covering: no progress, or kMaxCovering too small";
    out.picks[out.size++] = valid[best];
    for (std::size_t p : pairs[best]) covered[p] = true;
    left -= best_gain;
  }
  return out;
}
inline constexpr Covering kCovering = make_covering();

namespace detail {
template <std::size_t First, class Seq>
struct covering_slice;
template <std::size_t First, std::size_t... I>
struct covering_slice<First, std::index_sequence<I...>> {
  using type = std::tuple<std::integral_constant<std::size_t, kCovering.picks[First + I]>...>;
};
}  // namespace detail

/// The covering subset's compositions First to Last (exclusive), as a std::tuple of their
/// indices as integral constants (what Catch2's TEMPLATE_LIST_TEST_CASE takes).
template <std::size_t First, std::size_t Last>
using covering_slice_t = typename detail::covering_slice<First, std::make_index_sequence<Last - First>>::type;

}  // namespace polyshard::test::lattice
