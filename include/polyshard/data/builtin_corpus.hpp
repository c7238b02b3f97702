// A corpus that ships inside the library, so the training program has something to learn
// with no download: English-like sentences drawn from a small grammar by a seeded generator.
// Its structure (words, agreement, punctuation) gives a model clear patterns to pick up.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace polyshard {

/// About `bytes` characters of generated text; the same bytes for the same seed on every
/// platform (the generator is a fixed integer hash, not a standard-library distribution).
inline std::string builtin_corpus(std::size_t bytes = 1 << 20, std::uint64_t seed = 2024) {
  static constexpr std::array<std::string_view, 12> subjects = {
      "the old sailor", "a young engineer", "the quiet river", "my neighbour", "the small robot", "a tired student",
      "the red fox", "our teacher", "the city council", "a curious child", "the ancient library", "the night train"};
  static constexpr std::array<std::string_view, 12> verbs = {
      "watches", "builds", "remembers", "carries", "follows", "explains", "paints", "finds", "repairs", "opens",
      "measures", "counts"};
  static constexpr std::array<std::string_view, 12> objects = {
      "the heavy box", "a silver key", "the morning light", "every small stone", "the broken clock",
      "a long letter", "the distant hills", "seven green apples", "the last page", "a quiet song",
      "the northern road", "a paper boat"};
  static constexpr std::array<std::string_view, 8> places = {
      "near the harbour", "in the garden", "before dawn", "after the storm", "under the bridge",
      "at the market", "on the hill", "by the window"};
  static constexpr std::array<std::string_view, 6> links = {" and then ", ", while ", " because ", " so ",
                                                            ", but ", " until "};
  std::uint64_t state = seed;
  auto next = [&state](std::size_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::size_t>((state >> 33) % n);
  };
  auto clause = [&](std::string& out) {
    out += subjects[next(subjects.size())];
    out += ' ';
    out += verbs[next(verbs.size())];
    out += ' ';
    out += objects[next(objects.size())];
    if (next(2) == 0) {
      out += ' ';
      out += places[next(places.size())];
    }
  };
  std::string text;
  text.reserve(bytes + 256);
  while (text.size() < bytes) {
    std::string sentence;
    clause(sentence);
    if (next(3) == 0) {
      sentence += links[next(links.size())];
      clause(sentence);
    }
    sentence[0] = static_cast<char>(sentence[0] - 'a' + 'A');
    sentence += next(5) == 0 ? "!\n" : ".\n";
    text += sentence;
  }
  text.resize(bytes);
  return text;
}

}  // namespace polyshard
