// Generation: the sampler's distribution against softmax(logits / temperature), and generate()
// with its cache against a loop that recomputes the whole prefix for every token.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "polyshard/nn/nn.hpp"

using namespace polyshard;

namespace {
/// Frequencies of n draws (indices 0 to n - 1) from `logits`.
std::vector<double> frequencies(const std::vector<float>& logits, const SamplingConfig& c, int n) {
  std::vector<double> f(logits.size());
  for (int i = 0; i < n; ++i) f[static_cast<std::size_t>(sample_token(std::span<const float>(logits), c, std::uint64_t(i)))] += 1.0 / n;
  return f;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double total = 0;
  for (std::size_t i = 0; i < p.size(); ++i) total += (p[i] = std::exp(double(logits[i]) / temperature));
  for (double& x : p) x /= total;
  return p;
}

/// A GPT with weights large enough that its next-token distributions are far from uniform.
struct TrainedLikeGpt {
  Gpt<double> model{GptConfig{.vocab_size = 9, .block_size = 12, .n_layer = 2, .n_head = 2, .n_embd = 8}};
  FlatParameters<double> flat{model};
  TrainedLikeGpt() {
    flat.initialize(21);
    for (double& x : flat.values().span()) x *= 15;
  }
};

/// generate() without a cache: the whole sequence through logits() for every new token.
std::vector<std::int32_t> generate_uncached(const Gpt<double>& model, std::vector<std::int32_t> tokens,
                                            const SamplingConfig& c) {
  NoGradGuard no_grad;
  for (std::int64_t n = 0; n < c.new_tokens; ++n) {
    const auto t = static_cast<std::int64_t>(tokens.size());
    const Tensor<double> logits = model.logits(Tensor<std::int32_t>::from({1, t}, tokens)).value();
    const std::span<const double> last(logits.data() + (t - 1) * 9, 9);
    tokens.push_back(sample_token(last, c, std::uint64_t(n)));
  }
  return tokens;
}
}  // namespace

TEST_CASE("sample_token draws from softmax(logits / temperature)", "[nn][generate]") {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f};
  const int n = 40000;
  for (const double temperature : {1.0, 0.7, 2.5}) {
    const auto f = frequencies(logits, {.temperature = temperature, .seed = 3}, n);
    const auto p = softmax(logits, temperature);
    for (std::size_t i = 0; i < p.size(); ++i)  // five standard deviations of a frequency
      CHECK(std::abs(f[i] - p[i]) <= 5 * std::sqrt(p[i] * (1 - p[i]) / n));
  }
}

TEST_CASE("sample_token's top_k draws among the k most likely, renormalised", "[nn][generate]") {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f};
  const int n = 40000;
  const auto f = frequencies(logits, {.temperature = 1.0, .top_k = 2, .seed = 8}, n);
  const double p2 = std::exp(2.0) / (std::exp(2.0) + std::exp(1.0));  // tokens 2 and 1 only
  CHECK(f[0] == 0.0);
  CHECK(f[3] == 0.0);
  CHECK(f[4] == 0.0);
  CHECK(std::abs(f[2] - p2) <= 5 * std::sqrt(p2 * (1 - p2) / n));
  // top_k 1 is greedy at any temperature.
  for (std::uint64_t i = 0; i < 50; ++i)
    CHECK(sample_token(std::span<const float>(logits), {.temperature = 5.0, .top_k = 1, .seed = 1}, i) == 2);
}

TEST_CASE("sample_token with temperature 0 is the first most likely token", "[nn][generate]") {
  const std::vector<float> logits = {0.0f, 3.0f, -1.0f, 3.0f};
  CHECK(sample_token(std::span<const float>(logits), {.temperature = 0.0}, 0) == 1);
  CHECK_THROWS_WITH(sample_token(std::span<const float>(logits), {.temperature = -1.0}, 0),
                    Catch::Contains("temperature must be finite and non-negative"));
}

TEST_CASE("generate with a cache draws the sequence that recomputing every prefix draws", "[nn][generate]") {
  TrainedLikeGpt gpt;
  const std::vector<std::int32_t> prompt = {4, 1, 7};
  for (const SamplingConfig c : {SamplingConfig{.new_tokens = 9, .temperature = 0.0},
                                 SamplingConfig{.new_tokens = 9, .temperature = 1.0, .seed = 5},
                                 SamplingConfig{.new_tokens = 9, .temperature = 0.8, .top_k = 3, .seed = 6}}) {
    const auto cached = gpt.model.generate(prompt, c);
    CHECK(cached == generate_uncached(gpt.model, prompt, c));
    CHECK(cached.size() == prompt.size() + 9);
    CHECK(std::equal(prompt.begin(), prompt.end(), cached.begin()));
  }
  // The seed decides the draws: another seed gives another sequence.
  const auto a = gpt.model.generate(prompt, {.new_tokens = 9, .seed = 5});
  const auto b = gpt.model.generate(prompt, {.new_tokens = 9, .seed = 50});
  CHECK(a == gpt.model.generate(prompt, {.new_tokens = 9, .seed = 5}));
  CHECK(a != b);
}

TEST_CASE("generate names a prompt it cannot continue", "[nn][generate]") {
  TrainedLikeGpt gpt;
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  CHECK_THROWS_WITH(gpt.model.generate(std::vector<std::int32_t>{}, {}), Catch::Contains("the prompt is empty"));
  CHECK_THROWS_WITH(gpt.model.generate(prompt, {.new_tokens = 11}),
                    Catch::Contains("a prompt of 3 tokens and 11 new tokens exceed the model's 12 positions"));
  CHECK(gpt.model.generate(prompt, {.new_tokens = 10}).size() == 13);  // the last token is never fed back
}
