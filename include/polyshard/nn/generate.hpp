// Autoregressive generation from a language model with a key-value cache: the prompt is run
// once, then each new token is one position of work. Sampling is deterministic given the seed.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <functional>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "polyshard/core/counter_rng.hpp"
#include "polyshard/nn/kv_cache.hpp"

namespace polyshard {

/// How generate() picks each token.
struct SamplingConfig {
  std::int64_t new_tokens = 32;  ///< tokens to generate after the prompt
  double temperature = 1.0;      ///< logits are divided by it; 0 picks the most likely token (greedy)
  std::int64_t top_k = 0;        ///< draw among the k most likely tokens only (ties with the k-th kept); 0: all
  std::uint64_t seed = 0;        ///< token n is drawn with the n-th value of this seed's stream
};

/// The token drawn from one position's logits: argmax when temperature is 0 (the first of equal
/// maxima), else a draw from softmax(logits / temperature) restricted to the top_k, with the
/// `index`-th uniform of the seed's stream.
template <class T>
std::int32_t sample_token(std::span<const T> logits, const SamplingConfig& c, std::uint64_t index) {
  POLYSHARD_CHECK(!logits.empty(), "sample_token: no logits");
  POLYSHARD_CHECK(c.temperature >= 0 && std::isfinite(c.temperature), "sample_token: temperature must be finite and ",
                  "non-negative (0: greedy), got ", c.temperature);
  POLYSHARD_CHECK(c.top_k >= 0, "sample_token: top_k must be non-negative (0: every token), got ", c.top_k);
  if (c.temperature == 0)
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<double> z(logits.size());
  for (std::size_t i = 0; i < z.size(); ++i) z[i] = static_cast<double>(logits[i]) / c.temperature;
  double floor = -std::numeric_limits<double>::infinity();
  if (c.top_k > 0 && static_cast<std::size_t>(c.top_k) < z.size()) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (c.top_k - 1), sorted.end(), std::greater<>());
    floor = sorted[static_cast<std::size_t>(c.top_k - 1)];
  }
  const double top = *std::max_element(z.begin(), z.end());
  double total = 0;
  for (double& v : z) total += (v = v >= floor ? std::exp(v - top) : 0.0);
  // 53 random bits: a uniform in [0, 1), scaled to the unnormalised total.
  const double u = static_cast<double>(counter_bits(c.seed, index) >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  std::size_t last = 0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    if (z[i] == 0) continue;
    cumulative += z[i];
    last = i;
    if (u < cumulative) return static_cast<std::int32_t>(i);
  }
  return static_cast<std::int32_t>(last);  // u within rounding of the total
}

/// A model generate() can drive: it makes a host key-value cache for a batch, and computes
/// logits (B, T, vocab) of T new positions that follow the cached ones, caching theirs.
template <class M>
concept CachedLanguageModel = requires(const M& m, const Tensor<std::int32_t>& ids, std::int64_t batch) {
  { m.make_kv_cache(batch) };
  { m.logits(ids, std::declval<decltype(m.make_kv_cache(batch))&>()) };
};

/// Runs a forward as it stands; an engine runs it under its strategy's hooks instead.
struct PlainForward {
  template <class F>
  auto operator()(F&& f) const {
    return f();
  }
};
/// Every process drew the same token: nothing to agree on.
struct NoAgreement {
  void operator()(std::int32_t&) const {}
};

/// The prompt followed by c.new_tokens generated tokens. The prompt is run once to fill the
/// cache; each new token is then one position. `forward(f)` runs each forward f (PlainForward,
/// or an engine's); `agree(token)` may replace a drawn token by another process's, so that
/// processes holding parts of the model continue from the same sequence.
template <CachedLanguageModel M, class Forward = PlainForward, class Agree = NoAgreement>
std::vector<std::int32_t> generate(const M& model, std::span<const std::int32_t> prompt, const SamplingConfig& c,
                                   Forward&& forward = {}, Agree&& agree = {}) {
  POLYSHARD_CHECK(!prompt.empty(), "generate: the prompt is empty; give at least one token");
  POLYSHARD_CHECK(c.new_tokens >= 0, "generate: new_tokens must be non-negative, got ", c.new_tokens);
  NoGradGuard no_grad;
  auto cache = model.make_kv_cache(1);
  const auto length = static_cast<std::int64_t>(prompt.size());
  // The last token drawn is never fed back, so the cache holds one position fewer.
  POLYSHARD_CHECK(length + std::max<std::int64_t>(c.new_tokens - 1, 0) <= cache.capacity(), "generate: a prompt of ",
                  length, " tokens and ", c.new_tokens, " new tokens exceed the model's ", cache.capacity(),
                  " positions");
  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  Tensor<std::int32_t> ids = Tensor<std::int32_t>::from({1, length}, prompt);
  for (std::int64_t n = 0; n < c.new_tokens; ++n) {
    const auto logits = forward([&] { return model.logits(ids, cache); });  // (1, T, vocab)
    const auto last = logits.value().contiguous();
    const std::int64_t vocab = last.size(2), t = last.size(1);
    const std::span<const typename decltype(last)::value_type> row(last.data() + (t - 1) * vocab,
                                                                   static_cast<std::size_t>(vocab));
    std::int32_t token = sample_token(row, c, static_cast<std::uint64_t>(n));
    agree(token);
    tokens.push_back(token);
    ids = Tensor<std::int32_t>::from({1, 1}, std::span<const std::int32_t>(&token, 1));
  }
  return tokens;
}

}  // namespace polyshard
