// Tensor kernels against naive references: elementwise, cast, softmax, layer norm, embedding,
// cross-entropy, attention; and the errors they raise.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "support/finite_difference.hpp"
#include "polyshard/tensor/ops.hpp"

using namespace polyshard;
using test::random_tensor;

namespace {
template <class T>
Tensor<T> random_as(const Shape& shape, std::uint64_t seed, double scale = 1.0) {
  return cast<T>(random_tensor(shape, seed, scale));
}

using test::random_ids;

/// Softmax of one row in double, the textbook way (shifted by the max).
std::vector<double> naive_softmax(const double* x, std::int64_t n) {
  double m = x[0];
  for (std::int64_t j = 1; j < n; ++j) m = std::max(m, x[j]);
  std::vector<double> p(static_cast<std::size_t>(n));
  double s = 0;
  for (std::int64_t j = 0; j < n; ++j) s += p[j] = std::exp(x[j] - m);
  for (auto& v : p) v /= s;
  return p;
}

template <class T>
double tol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}
}  // namespace

TEMPLATE_TEST_CASE("add, mul and scale compute elementwise in the compute type", "[tensor][ops]", float, double,
                   half, bfloat16) {
  const Shape shape = GENERATE(Shape{1}, Shape{3, 5}, Shape{2, 1, 33});
  CAPTURE(shape);
  const auto a64 = random_tensor(shape, 1), b64 = random_tensor(shape, 2);
  const auto a = cast<TestType>(a64), b = cast<TestType>(b64);
  const auto sum = add(a, b), prod = mul(a, b), scaled = scale(a, -1.5);
  // Each result is the rounded float (or double) result of the rounded inputs.
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    using C = compute_t<TestType>;
    const C x = C(a.data()[i]), y = C(b.data()[i]);
    CHECK(C(sum.data()[i]) == C(TestType(x + y)));
    CHECK(C(prod.data()[i]) == C(TestType(x * y)));
    CHECK(C(scaled.data()[i]) == C(TestType(x * C(-1.5))));
  }
  add_into(a, b, a);  // in place
  CHECK(cast<double>(a).to_vector() == cast<double>(sum).to_vector());
}

TEST_CASE("elementwise ops name the op and both shapes on a mismatch", "[tensor][ops]") {
  const auto a = Tensor<float>::zeros({2, 3}), b = Tensor<float>::zeros({3, 2});
  CHECK_THROWS_WITH(add(a, b), Catch::Contains("add") && Catch::Contains("(2, 3)") && Catch::Contains("(3, 2)"));
  CHECK_THROWS_WITH(mul(a, b), Catch::Contains("mul") && Catch::Contains("(2, 3)") && Catch::Contains("(3, 2)"));
  const auto hb = Tensor<bfloat16>::zeros({4}), hc = Tensor<bfloat16>::zeros({5});
  CHECK_THROWS_WITH(add(hb, hc), Catch::Contains("add") && Catch::Contains("(4,)") && Catch::Contains("(5,)"));
  CHECK_THROWS_WITH(scale_into(a, 2.0, Tensor<float>::empty({6})),
                    Catch::Contains("scale") && Catch::Contains("(6,)") && Catch::Contains("(2, 3)"));
}

TEST_CASE("elementwise ops read transposed views", "[tensor][ops]") {
  const auto a = random_tensor({3, 4}, 1), b = random_tensor({4, 3}, 2);
  const auto s = add(a.transpose(), b);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) CHECK(s.at(i, j) == a.at(j, i) + b.at(i, j));
}

TEST_CASE("cast: float -> bfloat16 -> float within 2^-8 relative, half within 2^-11", "[tensor][ops]") {
  const auto x = cast<float>(random_tensor({1000}, 3, 100.0));
  const auto bf = cast<float>(cast<bfloat16>(x));
  const auto hf = cast<float>(cast<half>(x));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data()[i];
    CHECK(std::abs(bf.data()[i] - v) <= std::ldexp(1.0, -8) * std::abs(v));
    CHECK(std::abs(hf.data()[i] - v) <= std::ldexp(1.0, -11) * std::abs(v));
  }
  // Exactly representable values survive every conversion, including to and from integers.
  const auto ints = Tensor<std::int32_t>::from({4}, {-3, 0, 7, 256});
  CHECK(cast<std::int32_t>(cast<bfloat16>(ints)).to_vector() == ints.to_vector());
  CHECK(cast<std::int64_t>(cast<half>(cast<double>(ints))).to_vector() == std::vector<std::int64_t>{-3, 0, 7, 256});
  CHECK_THROWS_WITH(cast_into(x, Tensor<double>::empty({999})),
                    Catch::Contains("cast") && Catch::Contains("(1000,)") && Catch::Contains("(999,)"));
}

TEST_CASE("cast: a tensor large enough to be split over the worker pool converts every element as one thread would",
          "[tensor][ops]") {
  // 2^20 + 37 elements: several parts of 2^18 or more, the last one ragged; 1, 3 and all threads.
  const std::int64_t n = (std::int64_t{1} << 20) + 37;
  const auto x = cast<float>(random_tensor({n}, 11, 50.0));
  for (unsigned threads : {1u, 3u, 0u}) {
    CAPTURE(threads);
    detail::optimizer_threads_setting().store(threads);
    auto narrow = Tensor<bfloat16>::full({n}, bfloat16(-1.0f));
    auto wide = Tensor<float>::full({n}, -1.0f);
    cast_into(x, narrow);
    cast_into(narrow, wide);
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const bfloat16 expected = element_cast<bfloat16>(x.data()[i]);
      wrong += narrow.data()[i] != expected || wide.data()[i] != element_cast<float>(expected);
    }
    CHECK(wrong == 0);
  }
  detail::optimizer_threads_setting().store(0);
}

TEMPLATE_TEST_CASE("softmax and log_softmax match a naive row softmax", "[tensor][ops]", float, double) {
  const Shape shape = GENERATE(Shape{1}, Shape{1, 1}, Shape{4, 7}, Shape{2, 3, 129});
  CAPTURE(shape);
  const auto x64 = random_tensor(shape, 5, 3.0);
  const auto x = cast<TestType>(x64);
  auto y = Tensor<TestType>::empty(shape), ly = Tensor<TestType>::empty(shape);
  softmax_forward(x, y);
  log_softmax_forward(x, ly);
  const std::int64_t n = shape.back(), rows = shape.leading(1);
  const auto xr = cast<double>(x);  // the rounded inputs the kernel saw
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto p = naive_softmax(xr.data() + r * n, n);
    for (std::int64_t j = 0; j < n; ++j) {
      CHECK(double(y.data()[r * n + j]) == Approx(p[j]).margin(tol<TestType>()).epsilon(tol<TestType>()));
      CHECK(double(ly.data()[r * n + j]) == Approx(std::log(p[j])).margin(tol<TestType>()).epsilon(tol<TestType>()));
    }
  }
}

TEST_CASE("softmax stays finite for large logits", "[tensor][ops]") {
  const auto x = Tensor<float>::from({3}, {1000.f, 1001.f, -1000.f});
  auto y = Tensor<float>::empty({3});
  softmax_forward(x, y);
  CHECK(y.at(0) == Approx(1 / (1 + std::exp(1.0))));
  CHECK(y.at(2) == 0.f);
}

TEMPLATE_TEST_CASE("layer_norm_forward matches a naive normalization", "[tensor][ops]", float, double) {
  const Shape shape = GENERATE(Shape{1}, Shape{5, 1}, Shape{3, 8}, Shape{2, 2, 77});
  CAPTURE(shape);
  const std::int64_t c = shape.back(), rows = shape.leading(1);
  const auto x = random_as<TestType>(shape, 1, 2.0);
  const auto w = random_as<TestType>({c}, 2), b = random_as<TestType>({c}, 3);
  Shape stats;
  for (int i = 0; i < shape.rank() - 1; ++i) stats.push_back(shape[i]);
  auto y = Tensor<TestType>::empty(shape), mean = Tensor<TestType>::empty(stats), rstd = Tensor<TestType>::empty(stats);
  layer_norm_forward(x, w, b, 1e-5, y, mean, rstd);
  for (std::int64_t r = 0; r < rows; ++r) {
    const TestType* xr = x.data() + r * c;
    double mu = 0, var = 0;
    for (std::int64_t j = 0; j < c; ++j) mu += double(xr[j]) / double(c);
    for (std::int64_t j = 0; j < c; ++j) var += (double(xr[j]) - mu) * (double(xr[j]) - mu) / double(c);
    CHECK(double(mean.data()[r]) == Approx(mu).margin(tol<TestType>()));
    CHECK(double(rstd.data()[r]) == Approx(1 / std::sqrt(var + 1e-5)).epsilon(tol<TestType>()));
    for (std::int64_t j = 0; j < c; ++j) {
      const double expected = (double(xr[j]) - mu) / std::sqrt(var + 1e-5) * double(w.data()[j]) + double(b.data()[j]);
      CHECK(double(y.data()[r * c + j]) == Approx(expected).margin(10 * tol<TestType>()).epsilon(10 * tol<TestType>()));
    }
  }
}

TEST_CASE("layer_norm_forward names the op and the shapes when weight does not fit", "[tensor][ops]") {
  const auto x = Tensor<float>::zeros({2, 4});
  auto y = Tensor<float>::empty({2, 4}), m = Tensor<float>::empty({2}), r = Tensor<float>::empty({2});
  CHECK_THROWS_WITH(layer_norm_forward(x, Tensor<float>::zeros({3}), Tensor<float>::zeros({4}), 1e-5, y, m, r),
                    Catch::Contains("layer_norm") && Catch::Contains("(3,)") && Catch::Contains("(2, 4)"));
}

TEST_CASE("gelu_forward matches the tanh formula", "[tensor][ops]") {
  const auto x = random_tensor({3, 50}, 4, 3.0);
  auto y = Tensor<double>::empty({3, 50});
  gelu_forward(x, y);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data()[i];
    const double expected = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    CHECK(y.data()[i] == Approx(expected).margin(1e-14));
  }
  const auto xf = cast<float>(x);
  auto yf = Tensor<float>::empty({3, 50});
  gelu_forward(xf, yf);
  for (std::int64_t i = 0; i < x.numel(); ++i) CHECK(double(yf.data()[i]) == Approx(y.data()[i]).margin(1e-5));
}

TEST_CASE("embedding_forward gathers rows and names an out-of-range id and V", "[tensor][ops]") {
  const auto table = random_tensor({5, 3}, 1);
  const auto ids = Tensor<std::int32_t>::from({2, 2}, {4, 0, 0, 2});
  auto out = Tensor<double>::empty({2, 2, 3});
  embedding_forward(ids, table, out);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int c = 0; c < 3; ++c) CHECK(out.at(i, j, c) == table.at(ids.at(i, j), c));
  const auto bad = Tensor<std::int32_t>::from({3}, {1, 5, 2});
  auto out2 = Tensor<double>::empty({3, 3});
  CHECK_THROWS_WITH(embedding_forward(bad, table, out2),
                    Catch::Contains("embedding") && Catch::Contains("id 5") && Catch::Contains("V = 5"));
  const auto negative = Tensor<std::int32_t>::from({1}, {-1});
  CHECK_THROWS_WITH(embedding_forward(negative, table, Tensor<double>::empty({1, 3})), Catch::Contains("id -1"));
}

TEMPLATE_TEST_CASE("cross_entropy_forward equals -log softmax gathered at the target", "[tensor][ops]", float,
                   double) {
  const auto [rows, v] = GENERATE(std::pair{1, 1}, std::pair{1, 5}, std::pair{6, 11}, std::pair{3, 300});
  CAPTURE(rows, v);
  const auto logits = random_as<TestType>({rows, v}, 9, 4.0);
  const auto targets = random_ids({rows}, v, 10);
  auto losses = Tensor<TestType>::empty({rows}), lse = Tensor<TestType>::empty({rows});
  cross_entropy_forward(logits, targets, losses, lse);
  const auto lr = cast<double>(logits);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto p = naive_softmax(lr.data() + r * v, v);
    CHECK(double(losses.data()[r]) == Approx(-std::log(p[targets.data()[r]])).margin(tol<TestType>() * 10));
  }
}

TEST_CASE("cross_entropy names an out-of-range target and V", "[tensor][ops]") {
  const auto logits = Tensor<float>::zeros({2, 4});
  auto losses = Tensor<float>::empty({2}), lse = Tensor<float>::empty({2});
  CHECK_THROWS_WITH(cross_entropy_forward(logits, Tensor<std::int32_t>::from({2}, {0, 4}), losses, lse),
                    Catch::Contains("cross_entropy") && Catch::Contains("target 4") && Catch::Contains("V = 4"));
  CHECK_THROWS_WITH(cross_entropy_forward(logits, Tensor<std::int32_t>::from({3}, {0, 1, 2}), losses, lse),
                    Catch::Contains("cross_entropy") && Catch::Contains("(3,)") && Catch::Contains("(2, 4)"));
}

namespace {
/// Attention by its definition: an explicit masked loop over (b, h, i, j) in double.
Tensor<double> naive_attention(const Tensor<double>& qkv, int n_head) {
  const std::int64_t nb = qkv.size(0), nt = qkv.size(1), c = qkv.size(2) / 3, hd = c / n_head;
  auto out = Tensor<double>::zeros({nb, nt, c});  // (B, T, C)
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t h = 0; h < n_head; ++h)
      for (std::int64_t i = 0; i < nt; ++i) {
        std::vector<double> s(static_cast<std::size_t>(i + 1));
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < hd; ++d) dot += qkv.at(b, i, h * hd + d) * qkv.at(b, j, c + h * hd + d);
          s[j] = dot / std::sqrt(double(hd));
        }
        const auto p = naive_softmax(s.data(), i + 1);
        for (std::int64_t j = 0; j <= i; ++j)
          for (std::int64_t d = 0; d < hd; ++d) out.at(b, i, h * hd + d) += p[j] * qkv.at(b, j, 2 * c + h * hd + d);
      }
  return out;
}
}  // namespace

TEMPLATE_TEST_CASE("causal_self_attention_forward matches an explicit masked loop", "[tensor][ops]", float, double) {
  // T beyond one 64-row block and not a multiple of it exercises the blocked causal GEMMs.
  const auto [nb, nt, n_head, hd] = GENERATE(std::tuple{1, 1, 1, 1}, std::tuple{2, 5, 3, 2}, std::tuple{1, 7, 1, 8},
                                             std::tuple{2, 70, 2, 4}, std::tuple{1, 131, 4, 3});
  CAPTURE(nb, nt, n_head, hd);
  const std::int64_t c = std::int64_t(n_head) * hd;
  const auto qkv64 = random_tensor({nb, nt, 3 * c}, 11);
  const auto qkv = cast<TestType>(qkv64);
  auto out = Tensor<TestType>::empty({nb, nt, c});
  auto att = Tensor<TestType>::empty({nb, n_head, nt, nt});
  causal_self_attention_forward(qkv, n_head, out, att);
  const auto expected = naive_attention(cast<double>(qkv), n_head);
  for (std::int64_t i = 0; i < out.numel(); ++i)
    CHECK(double(out.data()[i]) == Approx(expected.data()[i]).margin(10 * tol<TestType>()));
  // The saved probabilities are a lower-triangular row-stochastic matrix per head.
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t h = 0; h < n_head; ++h)
      for (std::int64_t i = 0; i < nt; ++i) {
        double s = 0;
        for (std::int64_t j = 0; j < nt; ++j) {
          if (j > i) CHECK(att.at(b, h, i, j) == TestType(0));
          s += double(att.at(b, h, i, j));
        }
        CHECK(s == Approx(1.0).epsilon(tol<TestType>()));
      }
}

TEST_CASE("causal_self_attention rejects a qkv that does not split into heads", "[tensor][ops]") {
  auto out = Tensor<float>::empty({1, 2, 3}), att = Tensor<float>::empty({1, 2, 2, 2});
  CHECK_THROWS_WITH(causal_self_attention_forward(Tensor<float>::zeros({1, 2, 9}), 2, out, att),
                    Catch::Contains("causal_self_attention") && Catch::Contains("(1, 2, 9)"));
}

TEMPLATE_TEST_CASE("linear_forward and linear_backward match the sums they stand for", "[tensor][ops]", float, double) {
  const std::int64_t rows = 7, in = 5, out = 3;
  const auto x = random_as<TestType>({rows, in}, 1), w = random_as<TestType>({out, in}, 2);
  const auto b = random_as<TestType>({out}, 3), dy = random_as<TestType>({rows, out}, 4);
  const bool with_bias = GENERATE(true, false);
  CAPTURE(with_bias);

  auto y = Tensor<TestType>::full({rows, out}, TestType(NAN));
  linear_forward(x, w, with_bias ? b : Tensor<TestType>(), y);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = with_bias ? double(b.at(o)) : 0.0;
      for (std::int64_t i = 0; i < in; ++i) s += double(x.at(r, i)) * double(w.at(o, i));
      CHECK(double(y.at(r, o)) == Approx(s).epsilon(tol<TestType>()));
    }

  // dx overwritten, dweight and dbias added to what they hold (as under gradient accumulation).
  auto dx = Tensor<TestType>::full({rows, in}, TestType(NAN));
  auto dw = Tensor<TestType>::full({out, in}, TestType(1)), db = Tensor<TestType>::full({out}, TestType(2));
  linear_backward(x, w, dy, GradOut<TestType>{dx}, GradOut<TestType>{dw, true}, GradOut<TestType>{db, true});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (std::int64_t o = 0; o < out; ++o) s += double(dy.at(r, o)) * double(w.at(o, i));
      CHECK(double(dx.at(r, i)) == Approx(s).epsilon(tol<TestType>()));
    }
  for (std::int64_t o = 0; o < out; ++o) {
    double sb = 2;
    for (std::int64_t r = 0; r < rows; ++r) sb += double(dy.at(r, o));
    CHECK(double(db.at(o)) == Approx(sb).epsilon(tol<TestType>()));
    for (std::int64_t i = 0; i < in; ++i) {
      double s = 1;
      for (std::int64_t r = 0; r < rows; ++r) s += double(dy.at(r, o)) * double(x.at(r, i));
      CHECK(double(dw.at(o, i)) == Approx(s).epsilon(tol<TestType>()));
    }
  }
}

TEST_CASE("linear_forward names the op and the shapes that do not fit", "[tensor][ops]") {
  const auto x = Tensor<float>::zeros({4, 5}), w = Tensor<float>::zeros({3, 6}), y = Tensor<float>::zeros({4, 3});
  CHECK_THROWS_WITH(linear_forward(x, w, Tensor<float>(), y),
                    Catch::Contains("linear") && Catch::Contains("(4, 5)") && Catch::Contains("(3, 6)"));
  const auto w2 = Tensor<float>::zeros({3, 5}), bad_bias = Tensor<float>::zeros({4});
  CHECK_THROWS_WITH(linear_forward(x, w2, bad_bias, y), Catch::Contains("bias of shape"));
}
