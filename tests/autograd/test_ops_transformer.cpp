// Gradients and values of the transformer ops (gelu, silu, layer_norm, rms_norm, rope,
// grouped_qkv, embedding, softmax, log_softmax, cross_entropy, causal_self_attention) against
// finite differences and references.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "support/finite_difference.hpp"
#include "polyshard/autograd/ops.hpp"
#include "polyshard/tensor/ops/cast.hpp"

using namespace polyshard;
using test::gradient_error;
using test::random_tensor;
using test::random_ids;
using Vars = std::vector<Var<double>>;

TEST_CASE("gelu: gradient", "[autograd][ops]") {
  const Shape s = GENERATE(Shape{1}, Shape{3, 5}, Shape{2, 1, 7}, Shape{1500});  // 1500: more than one block
  CAPTURE(s);
  const auto x = random_tensor(s, 1, 2.0);
  CHECK(gradient_error([](const Vars& v) { return gelu(v[0]); }, {x}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return add(gelu(v[0]), gelu(v[0])); }, {x}) < 1e-6);
}

TEST_CASE("silu: values as torch.nn.functional.silu, and gradient", "[autograd][ops]") {
  // x sigmoid(x) at 0, 1, -2 and far out on both sides, where exp(-x) overflows or vanishes.
  const Var<double> x(Tensor<double>::from({5}, std::vector<double>{0.0, 1.0, -2.0, -800.0, 800.0}), true);
  const std::vector<double> y = silu(x).value().to_vector();
  CHECK(y[0] == 0.0);
  CHECK(y[1] == Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-15));
  CHECK(y[2] == Approx(-2.0 / (1.0 + std::exp(2.0))).epsilon(1e-15));
  CHECK(y[3] == 0.0);
  CHECK(y[4] == 800.0);
  const Shape s = GENERATE(Shape{1}, Shape{3, 5}, Shape{2, 1, 7}, Shape{1500});  // 1500: more than one block
  CAPTURE(s);
  const auto in = random_tensor(s, 1, 3.0);
  CHECK(gradient_error([](const Vars& v) { return silu(v[0]); }, {in}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return add(silu(v[0]), silu(v[0])); }, {in}) < 1e-6);
}

TEST_CASE("swiglu feed-forward: w2(silu(w1 x) * w3 x), gradients of input and the three weights", "[autograd][ops]") {
  // Llama's MLP with bias-free projections: C = 6 channels, hidden 10.
  const std::vector<Tensor<double>> in{random_tensor({2, 3, 6}, 1, 1.5), random_tensor({10, 6}, 2, 0.5),
                                       random_tensor({6, 10}, 3, 0.5), random_tensor({10, 6}, 4, 0.5)};
  CHECK(gradient_error([](const Vars& v) { return linear(mul(silu(linear(v[0], v[1])), linear(v[0], v[3])), v[2]); },
                       in) < 1e-6);
}

TEST_CASE("rms_norm: values as torch.nn.RMSNorm, eps inside the square root", "[autograd][ops]") {
  // Row (3, 4): mean square 12.5. With eps = 0.5 the root is sqrt(13) = 3.6056, and each
  // element is x / sqrt(13) times its weight; no mean is subtracted, no bias added.
  const Var<double> x(Tensor<double>::from({1, 2}, std::vector<double>{3.0, 4.0}), true);
  const Var<double> w(Tensor<double>::from({2}, std::vector<double>{1.0, -2.0}), true);
  const std::vector<double> y = rms_norm(x, w, 0.5).value().to_vector();
  CHECK(y[0] == Approx(3.0 / std::sqrt(13.0)).epsilon(1e-15));
  CHECK(y[1] == Approx(-8.0 / std::sqrt(13.0)).epsilon(1e-15));
}

TEST_CASE("rms_norm: gradients of input and weight", "[autograd][ops]") {
  const auto [rows, c] = GENERATE(std::pair{1, 1}, std::pair{3, 2}, std::pair{1, 6}, std::pair{4, 5}, std::pair{2, 33});
  const double eps = GENERATE(1e-6, 0.1);
  CAPTURE(rows, c, eps);
  const std::vector<Tensor<double>> in{random_tensor({2, rows, c}, 1, 2.0), random_tensor({c}, 2)};
  CHECK(gradient_error([eps](const Vars& v) { return rms_norm(v[0], v[1], eps); }, in) < 1e-6);
  // Weight used twice, input fed through twice: every accumulating path.
  CHECK(gradient_error([eps](const Vars& v) { return rms_norm(add(rms_norm(v[0], v[1], eps), v[0]), v[1], eps); }, in) <
        1e-6);
}

TEST_CASE("rms_norm names the op and the shapes when the weight does not fit", "[autograd][ops]") {
  const Var<double> x(random_tensor({2, 4}, 1), true), w(random_tensor({5}, 2), true);
  CHECK_THROWS_WITH(rms_norm(x, w, 1e-6), Catch::Contains("rms_norm") && Catch::Contains("(5,)") &&
                                              Catch::Contains("(2, 4)"));
  CHECK_THROWS_WITH(rms_norm(x, Var<double>(random_tensor({4}, 2), true), -1.0), Catch::Contains("eps"));
}

namespace {
/// Hugging Face's apply_rotary_pos_emb written out for one head row at position p:
/// q * cos + rotate_half(q) * sin, with cos = cat(cos(freqs), cos(freqs)) and
/// rotate_half(q) = cat(-q[d/2:], q[:d/2]).
std::vector<double> rotate_half_reference(const double* q, std::int64_t d, std::int64_t p, double theta) {
  std::vector<double> freqs(static_cast<std::size_t>(d));
  for (std::int64_t j = 0; j < d; ++j) freqs[std::size_t(j)] = double(p) / std::pow(theta, double(2 * (j % (d / 2))) / double(d));
  std::vector<double> out(static_cast<std::size_t>(d));
  for (std::int64_t j = 0; j < d; ++j) {
    const double rotated = j < d / 2 ? -q[j + d / 2] : q[j - d / 2];
    out[std::size_t(j)] = q[j] * std::cos(freqs[std::size_t(j)]) + rotated * std::sin(freqs[std::size_t(j)]);
  }
  return out;
}
}  // namespace

TEST_CASE("rope: values as Hugging Face's rotate-half, with a position offset", "[autograd][ops]") {
  const double theta = GENERATE(10000.0, 500000.0);
  const std::int64_t offset = GENERATE(0, 7);
  CAPTURE(theta, offset);
  const std::int64_t b = 2, t = 5, h = 3, d = 8;
  const auto x = random_tensor({b, t, h, d}, 1, 2.0);
  const auto y = rope(Var<double>(x, false), theta, offset).value();
  for (std::int64_t row = 0; row < b * t * h; ++row) {
    const auto want = rotate_half_reference(x.data() + row * d, d, (row / h) % t + offset, theta);
    for (std::int64_t j = 0; j < d; ++j) CHECK(y.data()[row * d + j] == Approx(want[std::size_t(j)]).margin(1e-13));
  }
}

TEST_CASE("rope: a query-key product depends on the positions' difference only", "[autograd][ops]") {
  // One query and one key, each rotated at positions m and n: <rope(q)_m, rope(k)_n> is the
  // same for (m, n) = (3, 1), (10, 8) and (105, 103), the property rotary embeddings exist for.
  const std::int64_t d = 16;
  const auto q = random_tensor({1, 1, 1, d}, 2), k = random_tensor({1, 1, 1, d}, 3);
  auto product = [&](std::int64_t m, std::int64_t n) {
    const auto rq = rope(Var<double>(q, false), 10000.0, m).value(), rk = rope(Var<double>(k, false), 10000.0, n).value();
    double dot = 0;
    for (std::int64_t j = 0; j < d; ++j) dot += rq.data()[j] * rk.data()[j];
    return dot;
  };
  const double base = product(3, 1);
  CHECK(product(10, 8) == Approx(base).epsilon(1e-12));
  CHECK(product(105, 103) == Approx(base).epsilon(1e-12));
  CHECK(std::abs(product(3, 3) - base) > 1e-3);  // a different difference gives a different product
}

TEST_CASE("rope: gradient, and errors that name the problem", "[autograd][ops]") {
  const auto x = random_tensor({2, 3, 2, 6}, 4, 2.0);
  CHECK(gradient_error([](const Vars& v) { return rope(v[0], 10000.0, 2); }, {x}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return add(rope(v[0], 100.0), rope(v[0], 100.0, 5)); }, {x}) < 1e-6);
  const Var<double> odd(random_tensor({1, 2, 1, 5}, 5), true), flat(random_tensor({2, 6}, 6), true);
  CHECK_THROWS_WITH(rope(odd), Catch::Contains("rope") && Catch::Contains("head_dim must be even"));
  CHECK_THROWS_WITH(rope(flat), Catch::Contains("(batch, positions, heads, head_dim)") && Catch::Contains("(2, 6)"));
  CHECK_THROWS_WITH(rope(Var<double>(x, true), 0.0), Catch::Contains("theta"));
  CHECK_THROWS_WITH(rope(Var<double>(x, true), 10.0, -1), Catch::Contains("offset"));
}

TEST_CASE("grouped_qkv: q as it is, each key-value head repeated for its group of query heads", "[autograd][ops]") {
  const auto [n_head, n_kv_head] = GENERATE(std::pair{4, 4}, std::pair{4, 2}, std::pair{6, 2}, std::pair{4, 1});
  CAPTURE(n_head, n_kv_head);
  const std::int64_t b = 2, t = 3, hd = 2, c = n_head * hd, ckv = n_kv_head * hd;
  const auto q = random_tensor({b, t, c}, 1), k = random_tensor({b, t, ckv}, 2), v = random_tensor({b, t, ckv}, 3);
  const auto qkv = grouped_qkv(Var<double>(q, false), Var<double>(k, false), Var<double>(v, false), n_head, n_kv_head)
                       .value();
  REQUIRE(qkv.shape() == Shape{b, t, 3 * c});
  const int group = n_head / n_kv_head;
  for (std::int64_t row = 0; row < b * t; ++row)
    for (std::int64_t h = 0; h < n_head; ++h)
      for (std::int64_t e = 0; e < hd; ++e) {
        const double* out = qkv.data() + row * 3 * c + h * hd + e;
        const std::int64_t kv = row * ckv + (h / group) * hd + e;  // Hugging Face's repeat_kv
        CHECK(out[0] == q.data()[row * c + h * hd + e]);
        CHECK(out[c] == k.data()[kv]);
        CHECK(out[2 * c] == v.data()[kv]);
      }
  CHECK(gradient_error([&](const Vars& x) { return grouped_qkv(x[0], x[1], x[2], n_head, n_kv_head); }, {q, k, v}) <
        1e-6);
  // Through the attention, with the key used for the values too: dk sums two paths.
  CHECK(gradient_error([&](const Vars& x) { return causal_self_attention(grouped_qkv(x[0], x[1], x[1], n_head, n_kv_head), n_head); },
                       {q, k}) < 1e-6);
}

TEST_CASE("grouped_qkv names the shapes that do not fit", "[autograd][ops]") {
  const Var<double> q(random_tensor({2, 3, 8}, 1), true), k(random_tensor({2, 3, 4}, 2), true);
  CHECK_THROWS_WITH(grouped_qkv(q, k, k, 4, 3), Catch::Contains("multiple of n_kv_head"));
  CHECK_THROWS_WITH(grouped_qkv(q, k, k, 4, 1), Catch::Contains("k and v must be") && Catch::Contains("(2, 3, 2)") &&
                                                    Catch::Contains("(2, 3, 4)"));
}

TEST_CASE("layer_norm: gradients of input, weight and bias", "[autograd][ops]") {
  const auto [rows, c] = GENERATE(std::pair{1, 2}, std::pair{3, 2}, std::pair{1, 6}, std::pair{4, 5}, std::pair{2, 33});
  CAPTURE(rows, c);
  const std::vector<Tensor<double>> in{random_tensor({2, rows, c}, 1, 2.0), random_tensor({c}, 2),
                                       random_tensor({c}, 3)};
  CHECK(gradient_error([](const Vars& v) { return layer_norm(v[0], v[1], v[2]); }, in) < 1e-6);
  // Weight and bias used twice, input fed through twice: every accumulating path.
  CHECK(gradient_error([](const Vars& v) { return layer_norm(add(layer_norm(v[0], v[1], v[2]), v[0]), v[1], v[2], 1e-3); },
                       in) < 1e-6);
}

TEST_CASE("layer_norm over one channel: output is the bias, input gradient vanishes", "[autograd][ops]") {
  // With C = 1 the exact input gradient is 0 and finite differences see exactly 0, so a relative
  // error is meaningless there; check the values instead.
  Var<double> x(random_tensor({3, 1}, 1), true), w(random_tensor({1}, 2), true), b(random_tensor({1}, 3), true);
  const Var<double> y = layer_norm(x, w, b);
  backward(y, Tensor<double>::full({3, 1}, 1.0));
  for (double e : y.value().to_vector()) CHECK(e == b.value().data()[0]);
  for (double g : x.grad().to_vector()) CHECK(std::abs(g) < 1e-10);
  CHECK(w.grad().data()[0] == 0.0);
  CHECK(b.grad().data()[0] == 3.0);
}

TEST_CASE("layer_norm names the op and the shapes when weight does not fit", "[autograd][ops]") {
  Var<float> x(Tensor<float>::zeros({2, 4}), true), w(Tensor<float>::zeros({5}), true), b(Tensor<float>::zeros({4}), true);
  CHECK_THROWS_WITH(layer_norm(x, w, b), Catch::Contains("layer_norm") && Catch::Contains("(5,)") &&
                                             Catch::Contains("(2, 4)"));
}

TEST_CASE("embedding: table gradient is a scatter-add over repeated ids", "[autograd][ops]") {
  const auto [v, c] = GENERATE(std::pair{1, 1}, std::pair{5, 3}, std::pair{7, 1});
  CAPTURE(v, c);
  const auto ids = random_ids({2, 6}, v, 4);  // 12 ids over at most 7 rows: repeats guaranteed
  const auto ids2 = random_ids({3}, v, 5);
  CHECK(gradient_error([&](const Vars& t) { return embedding(ids, t[0]); }, {random_tensor({v, c}, 6)}) < 1e-6);
  CHECK(gradient_error([&](const Vars& t) { return add(sum(embedding(ids, t[0])), mean(embedding(ids2, t[0]))); },
                       {random_tensor({v, c}, 7)}) < 1e-6);
}

TEST_CASE("embedding names an out-of-range id and V", "[autograd][ops]") {
  Var<float> table(Tensor<float>::zeros({10, 4}), true);
  CHECK_THROWS_WITH(embedding(Tensor<std::int32_t>::from({3}, {0, 12, 3}), table),
                    Catch::Contains("embedding") && Catch::Contains("id 12") && Catch::Contains("V = 10"));
}

TEST_CASE("softmax and log_softmax: gradients", "[autograd][ops]") {
  const Shape s = GENERATE(Shape{1}, Shape{1, 1}, Shape{3, 4}, Shape{2, 1, 9});
  CAPTURE(s);
  const auto x = random_tensor(s, 2, 2.0);
  CHECK(gradient_error([](const Vars& v) { return softmax(v[0]); }, {x}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return log_softmax(v[0]); }, {x}) < 1e-6);
  CHECK(gradient_error([](const Vars& v) { return add(softmax(v[0]), log_softmax(v[0])); }, {x}) < 1e-6);
}

TEST_CASE("cross_entropy: gradient", "[autograd][ops]") {
  const auto [shape, v] = GENERATE(std::pair{Shape{1}, 1}, std::pair{Shape{1}, 4}, std::pair{Shape{5}, 7},
                                   std::pair{Shape{2, 3}, 11});
  CAPTURE(shape, v);
  Shape ls = shape;
  ls.push_back(v);
  const auto targets = random_ids(shape, v, 8);
  // Unit scale: with saturated softmaxes the gradient shrinks to the finite differences' noise.
  const auto logits = random_tensor(ls, 9, 1.0);
  CHECK(gradient_error([&](const Vars& x) { return cross_entropy(x[0], targets); }, {logits}) < 1e-6);
  CHECK(gradient_error([&](const Vars& x) { return add(cross_entropy(x[0], targets), cross_entropy(x[0], targets)); },
                       {logits}) < 1e-6);
}

TEST_CASE("cross_entropy equals the mean of -log_softmax gathered at the targets", "[autograd][ops]") {
  const auto logits = random_tensor({3, 4, 13}, 10, 5.0);
  const auto targets = random_ids({3, 4}, 13, 11);
  const Var<double> x(logits);
  const Tensor<double> lp = log_softmax(x).value();  // (3, 4, 13)
  double expected = 0;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) expected -= lp.at(i, j, targets.at(i, j)) / 12.0;
  const Var<double> loss = cross_entropy(x, targets);
  CHECK(loss.shape() == Shape{});
  CHECK(loss.value().data()[0] == Approx(expected).epsilon(1e-12));
  // In float too, against the double reference.
  const Var<float> xf(cast<float>(logits));
  CHECK(double(cross_entropy(xf, targets).value().data()[0]) == Approx(expected).epsilon(1e-5));
}

TEST_CASE("cross_entropy names an out-of-range target and V", "[autograd][ops]") {
  Var<float> logits(Tensor<float>::zeros({2, 3, 5}), true);
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor<std::int32_t>::from({2, 3}, {0, 1, 2, 3, 4, -2})),
                    Catch::Contains("cross_entropy") && Catch::Contains("target -2") && Catch::Contains("V = 5"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor<std::int32_t>::zeros({3, 2})),
                    Catch::Contains("cross_entropy") && Catch::Contains("(3, 2)") && Catch::Contains("(2, 3, 5)"));
}

TEST_CASE("causal_self_attention: gradient", "[autograd][ops]") {
  // T = 67 and 130 cross the 64-row blocks of the causal GEMMs, ending mid-block.
  const auto [nb, nt, n_head, hd] = GENERATE(std::tuple{1, 1, 1, 1}, std::tuple{1, 1, 3, 2}, std::tuple{2, 5, 1, 3},
                                             std::tuple{2, 7, 2, 4}, std::tuple{1, 9, 4, 1}, std::tuple{1, 67, 2, 2},
                                             std::tuple{1, 130, 1, 1});
  CAPTURE(nb, nt, n_head, hd);
  const std::int64_t c = std::int64_t(n_head) * hd;
  const auto qkv = random_tensor({nb, nt, 3 * c}, 12);
  const int h = n_head;
  CHECK(gradient_error([h](const Vars& v) { return causal_self_attention(v[0], h); }, {qkv}) < 1e-6);
  if (nt < 20)
    CHECK(gradient_error([h](const Vars& v) { return add(causal_self_attention(v[0], h), causal_self_attention(v[0], h)); },
                         {qkv}) < 1e-6);
}

TEST_CASE("causal_self_attention rejects qkv that does not split into n_head heads", "[autograd][ops]") {
  Var<float> qkv(Tensor<float>::zeros({2, 3, 12}), true);
  CHECK_THROWS_WITH(causal_self_attention(qkv, 3), Catch::Contains("causal_self_attention") &&
                                                       Catch::Contains("(2, 3, 12)") && Catch::Contains("n_head = 3"));
}

TEST_CASE("a GPT-2 block's ops chained: gradients of every input", "[autograd][ops]") {
  // ln -> attention -> residual -> ln -> gelu MLP -> residual -> logits -> loss, tiny sizes.
  const std::int64_t b = 2, t = 3, c = 4, v = 5;
  const auto ids = random_ids({b, t}, int(v), 13), targets = random_ids({b, t}, int(v), 14);
  const std::vector<Tensor<double>> in{random_tensor({v, c}, 15), random_tensor({c}, 16), random_tensor({c}, 17),
                                       random_tensor({3 * c, c}, 18, 0.5), random_tensor({c, c}, 19, 0.5)};
  const double err = gradient_error(
      [&](const Vars& p) {
        const Var<double> x = embedding(ids, p[0]);                              // (B, T, C)
        const Var<double> a = causal_self_attention(linear(layer_norm(x, p[1], p[2]), p[3]), 2);
        const Var<double> h = x + a;                                             // (B, T, C)
        const Var<double> m = h + linear(gelu(layer_norm(h, p[1], p[2])), p[4]);  // (B, T, C)
        return scale(cross_entropy(linear(m, p[0]), targets), 2.0);              // tied head
      },
      in);
  CHECK(err < 1e-6);
}
