// Gradients and values of the transformer ops (gelu, layer_norm, embedding, softmax,
// log_softmax, cross_entropy, causal_self_attention) against finite differences and references.
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
