// The key-value cache: a cached forward fed the sequence in any chunks computes the rows of the
// full forward, for GPT-2's fused attention and for grouped-query attention with rotary keys.
#include <catch2/catch.hpp>

#include <vector>

#include "polyshard/nn/nn.hpp"
#include "support/finite_difference.hpp"

using namespace polyshard;

namespace {
using test::random_ids;

/// Positions [begin, end) of a (B, T, ...) tensor, as a contiguous copy.
template <class T>
Tensor<T> positions(const Tensor<T>& x, std::int64_t begin, std::int64_t end) {
  Shape shape = x.shape();
  const std::int64_t steps = shape[1], inner = x.numel() / (shape[0] * steps);
  shape[1] = end - begin;
  Tensor<T> out = Tensor<T>::empty(shape);
  const Tensor<T> c = x.contiguous();
  for (std::int64_t b = 0; b < shape[0]; ++b)
    std::copy_n(c.data() + (b * steps + begin) * inner, (end - begin) * inner, out.data() + b * (end - begin) * inner);
  return out;
}

template <class T>
double max_abs_difference(const Tensor<T>& a, const Tensor<T>& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double(x[i]) - double(y[i])));
  return worst;
}

const std::vector<std::vector<std::int64_t>> chunkings = {{9}, {1, 1, 1, 1, 1, 1, 1, 1, 1}, {3, 1, 2, 3}, {8, 1}};

/// Feeds `ids` (B, 9) to a GPT in the chunks of each chunking and compares every chunk's logits
/// with the full forward's rows.
template <class T>
void check_gpt_chunks(double tolerance) {
  GptConfig cfg{.vocab_size = 11, .block_size = 9, .n_layer = 2, .n_head = 2, .n_embd = 8};
  Gpt<T> model(cfg);
  FlatParameters<T> flat(model);
  flat.initialize(5);
  // Larger weights than GPT-2's 0.02, so that attention is far from uniform over the keys.
  for (T& x : flat.values().span()) x *= T(10);
  const auto ids = random_ids({2, 9}, 11, 3);
  NoGradGuard no_grad;
  const Tensor<T> full = model.logits(ids).value();  // (2, 9, 11)
  for (const auto& chunks : chunkings) {
    KvCache<T> cache = model.make_kv_cache(2);
    std::int64_t at = 0;
    for (const std::int64_t n : chunks) {
      const Tensor<T> got = model.logits(positions(ids, at, at + n), cache).value();
      CHECK(max_abs_difference(got, positions(full, at, at + n)) <= tolerance);
      at += n;
      CHECK(cache.length() == at);
    }
  }
}
}  // namespace

TEST_CASE("Gpt's cached logits are the full forward's rows, fed in any chunks", "[nn][generate]") {
  SECTION("double") { check_gpt_chunks<double>(1e-12); }
  SECTION("float") { check_gpt_chunks<float>(2e-5); }
}

TEST_CASE("GroupedQueryAttention's cached forward is its full forward, caching n_kv_head heads", "[nn][generate]") {
  const int kv_heads = GENERATE(4, 2, 1);
  GroupedQueryAttention<double> attn(8, 4, kv_heads, 500.0);
  FlatParameters<double> flat(attn);
  flat.initialize(11);
  for (double& x : flat.values().span()) x *= 20;
  auto x = Tensor<double>::empty({2, 6, 8});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = counter_normal(9, std::uint64_t(i));
  NoGradGuard no_grad;
  const Tensor<double> full = attn(Var<double>(x)).value();
  KvCache<double> cache(1, 2, 6, attn.kv_width());
  CHECK(cache.keys(0).shape() == Shape{2, 6, 2 * kv_heads});  // head_dim 2: only the shared heads are kept
  std::int64_t at = 0;
  for (const std::int64_t n : {2, 1, 3}) {
    const Tensor<double> got = attn.forward_cached(Var<double>(positions(x, at, at + n)), cache, 0).value();
    CHECK(max_abs_difference(got, positions(full, at, at + n)) <= 1e-12);
    cache.advance(n);
    at += n;
  }
}

TEST_CASE("cached_attention_forward with nothing cached is causal_self_attention_forward", "[nn][generate]") {
  const std::int64_t b = 2, t = 5, c = 6;
  const int heads = 3;
  auto qkv = Tensor<double>::empty({b, t, 3 * c});
  for (std::int64_t i = 0; i < qkv.numel(); ++i) qkv.data()[i] = 2 * counter_normal(4, std::uint64_t(i));
  auto expected = Tensor<double>::empty({b, t, c}), att = Tensor<double>::empty({b, heads, t, t});
  causal_self_attention_forward(qkv, heads, expected, att);
  auto cache_k = Tensor<double>::zeros({b, 7, c}), cache_v = Tensor<double>::zeros({b, 7, c});
  auto out = Tensor<double>::empty({b, t, c});
  cached_attention_forward(qkv, cache_k, cache_v, 0, heads, out);
  CHECK(max_abs_difference(out, expected) <= 1e-13);
  // The cache holds the keys and values of the five positions, rows 5 and 6 untouched.
  CHECK(cache_k.at(1, 4, 2) == qkv.at(1, 4, c + 2));
  CHECK(cache_v.at(0, 3, 5) == qkv.at(0, 3, 2 * c + 5));
  CHECK(cache_k.at(0, 5, 0) == 0.0);
}

TEST_CASE("A cached forward names what is wrong", "[nn][generate]") {
  GptConfig cfg{.vocab_size = 11, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 4};
  Gpt<float> model(cfg);
  FlatParameters<float> flat(model);
  flat.initialize(1);
  KvCache<float> cache = model.make_kv_cache(1);
  const auto three = random_ids({1, 3}, 11, 1), two = random_ids({1, 2}, 11, 2);
  CHECK_THROWS_WITH(model.logits(three, cache), Catch::Contains("has no backward") && Catch::Contains("NoGradGuard"));
  NoGradGuard no_grad;
  model.logits(three, cache);
  CHECK_THROWS_WITH(model.logits(two, cache),
                    Catch::Contains("3 cached and 2 new positions exceed the model's 4 positions"));
  KvCache<float> other(3, 1, 4, 4);
  CHECK_THROWS_WITH(model.logits(three, other), Catch::Contains("a cache of 3 layers for a model of 1"));
  auto q = Tensor<float>::zeros({1, 2, 4}), k = Tensor<float>::zeros({1, 2, 4}), out = Tensor<float>::empty({1, 2, 4});
  CHECK_THROWS_WITH(cached_attention_forward(q, k, k, cache.keys(0), cache.values(0), 0, 3, 2, out),
                    Catch::Contains("n_head (3) must be a positive multiple of n_kv_head (2)"));
}
