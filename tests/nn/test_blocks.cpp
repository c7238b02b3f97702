// The blocks of Llama-style models as modules: RMSNorm, Silu, LinearNoBias, the SwiGLU
// feed-forward and grouped-query attention with rotary embeddings, with PyTorch's and Hugging
// Face's names, layouts and defaults, and values against loops written out here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "support/finite_difference.hpp"
#include "polyshard/nn/nn.hpp"

using namespace polyshard;

namespace {
/// Every parameter's name and shape, in declaration order.
template <class M>
std::vector<std::pair<std::string, Shape>> names_and_shapes(M& module) {
  std::vector<std::pair<std::string, Shape>> out;
  visit_parameters(module, [&](const std::string& name, const auto& p) { out.emplace_back(name, p.shape()); });
  return out;
}

/// Row r of y = x W^T for W (out, in) stored row-major: out values.
std::vector<double> times_transposed(const double* x, const double* w, std::int64_t in, std::int64_t out) {
  std::vector<double> y(static_cast<std::size_t>(out), 0.0);
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) y[std::size_t(o)] += x[i] * w[o * in + i];
  return y;
}
}  // namespace

TEST_CASE("RMSNorm: torch's default eps per type, a weight of ones, PyTorch's name", "[nn][blocks]") {
  // torch.finfo(dtype).eps for float32, float64, float16 and bfloat16.
  CHECK(RMSNorm<float>(4).eps == 1.1920928955078125e-07);
  CHECK(RMSNorm<double>(4).eps == 2.220446049250313e-16);
  CHECK(machine_epsilon<half>() == 0.0009765625);
  CHECK(machine_epsilon<bfloat16>() == 0.0078125);
  RMSNorm<double> norm(4, 1e-6);
  CHECK(norm.eps == 1e-6);
  CHECK(names_and_shapes(norm) == std::vector<std::pair<std::string, Shape>>{{"weight", Shape{4}}});
  FlatParameters<double> flat(norm);
  flat.initialize(1);
  for (double w : norm.weight.var().value().to_vector()) CHECK(w == 1.0);
  // With a weight of ones: x / sqrt(mean(x^2) + eps) per row.
  const auto x = test::random_tensor({3, 4}, 2, 3.0);
  const auto y = norm(Var<double>(x, false)).value();
  for (std::int64_t r = 0; r < 3; ++r) {
    double ms = 0;
    for (std::int64_t c = 0; c < 4; ++c) ms += x.data()[r * 4 + c] * x.data()[r * 4 + c] / 4.0;
    for (std::int64_t c = 0; c < 4; ++c)
      CHECK(y.data()[r * 4 + c] == Approx(x.data()[r * 4 + c] / std::sqrt(ms + 1e-6)).epsilon(1e-14));
  }
}

TEST_CASE("SwiGlu: down(silu(gate x) * up x) with bias-free projections named as LlamaMLP's", "[nn][blocks]") {
  const std::int64_t dim = 3, hidden = 5;
  SwiGlu<double> mlp(dim, hidden);
  CHECK(names_and_shapes(mlp) == std::vector<std::pair<std::string, Shape>>{{"gate_proj.weight", Shape{hidden, dim}},
                                                                            {"up_proj.weight", Shape{hidden, dim}},
                                                                            {"down_proj.weight", Shape{dim, hidden}}});
  FlatParameters<double> flat(mlp);
  flat.initialize(3);
  for (double& v : flat.values().span()) v *= 20;  // weights of about 0.4: silu far from linear
  const auto x = test::random_tensor({2, dim}, 4, 2.0);
  const auto y = mlp(Var<double>(x, false)).value();
  const double* gate = mlp.gate_proj.weight.var().value().data();
  const double* up = mlp.up_proj.weight.var().value().data();
  const double* down = mlp.down_proj.weight.var().value().data();
  for (std::int64_t r = 0; r < 2; ++r) {
    const auto g = times_transposed(x.data() + r * dim, gate, dim, hidden);
    const auto u = times_transposed(x.data() + r * dim, up, dim, hidden);
    std::vector<double> h(static_cast<std::size_t>(hidden));
    for (std::size_t j = 0; j < h.size(); ++j) h[j] = g[j] / (1.0 + std::exp(-g[j])) * u[j];
    const auto want = times_transposed(h.data(), down, hidden, dim);
    for (std::int64_t c = 0; c < dim; ++c) CHECK(y.data()[r * dim + c] == Approx(want[std::size_t(c)]).epsilon(1e-13));
  }
}

TEST_CASE("Silu and LinearNoBias as modules: no parameters, and a weight without bias", "[nn][blocks]") {
  Silu<double> act;
  CHECK(names_and_shapes(act).empty());
  LinearNoBias<double> proj(4, 2);
  CHECK(names_and_shapes(proj) == std::vector<std::pair<std::string, Shape>>{{"weight", Shape{2, 4}}});
  CHECK(count_parameters(proj) == 8);
}

namespace {
/// Llama's attention for one batch row, written out: project, turn q and k by rotate-half at
/// positions 0..T-1, let query head h read key-value head h / group, softmax over the causal
/// window, then o_proj. x: (T, dim) row-major; weights as the module holds them.
std::vector<double> llama_attention_reference(const double* x, std::int64_t t_len, std::int64_t dim, int n_head,
                                              int n_kv_head, double theta, const double* wq, const double* wk,
                                              const double* wv, const double* wo) {
  const std::int64_t hd = dim / n_head, ckv = hd * n_kv_head, group = n_head / n_kv_head;
  auto turn = [&](std::vector<double>& row, std::int64_t heads, std::int64_t p) {
    for (std::int64_t h = 0; h < heads; ++h) {
      double* r = row.data() + h * hd;
      std::vector<double> out(static_cast<std::size_t>(hd));
      for (std::int64_t j = 0; j < hd; ++j) {
        const double a = double(p) / std::pow(theta, double(2 * (j % (hd / 2))) / double(hd));
        const double rotated = j < hd / 2 ? -r[j + hd / 2] : r[j - hd / 2];
        out[std::size_t(j)] = r[j] * std::cos(a) + rotated * std::sin(a);
      }
      std::copy(out.begin(), out.end(), r);
    }
  };
  std::vector<std::vector<double>> q, k, v;
  for (std::int64_t p = 0; p < t_len; ++p) {
    q.push_back(times_transposed(x + p * dim, wq, dim, dim));
    k.push_back(times_transposed(x + p * dim, wk, dim, ckv));
    v.push_back(times_transposed(x + p * dim, wv, dim, ckv));
    turn(q.back(), n_head, p);
    turn(k.back(), n_kv_head, p);
  }
  std::vector<double> out;
  for (std::int64_t p = 0; p < t_len; ++p) {
    std::vector<double> heads(static_cast<std::size_t>(dim), 0.0);
    for (std::int64_t h = 0; h < n_head; ++h) {
      const std::int64_t kvh = h / group;
      std::vector<double> scores;
      double top = -1e300;
      for (std::int64_t s = 0; s <= p; ++s) {
        double dot = 0;
        for (std::int64_t e = 0; e < hd; ++e) dot += q[std::size_t(p)][std::size_t(h * hd + e)] * k[std::size_t(s)][std::size_t(kvh * hd + e)];
        scores.push_back(dot / std::sqrt(double(hd)));
        top = std::max(top, scores.back());
      }
      double total = 0;
      for (double& sc : scores) total += (sc = std::exp(sc - top));
      for (std::int64_t s = 0; s <= p; ++s)
        for (std::int64_t e = 0; e < hd; ++e)
          heads[std::size_t(h * hd + e)] += scores[std::size_t(s)] / total * v[std::size_t(s)][std::size_t(kvh * hd + e)];
    }
    const auto o = times_transposed(heads.data(), wo, dim, dim);
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}
}  // namespace

TEST_CASE("GroupedQueryAttention computes Llama's attention: rotary q and k, shared key-value heads", "[nn][blocks]") {
  const auto [n_head, n_kv_head] = GENERATE(std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1});
  CAPTURE(n_head, n_kv_head);
  const std::int64_t dim = 16, hd = dim / n_head, t = 5;
  GroupedQueryAttention<double> attn(dim, n_head, n_kv_head, 500000.0);
  CHECK(names_and_shapes(attn) ==
        std::vector<std::pair<std::string, Shape>>{{"q_proj.weight", Shape{dim, dim}},
                                                   {"k_proj.weight", Shape{hd * n_kv_head, dim}},
                                                   {"v_proj.weight", Shape{hd * n_kv_head, dim}},
                                                   {"o_proj.weight", Shape{dim, dim}}});
  FlatParameters<double> flat(attn);
  flat.initialize(5);
  for (double& w : flat.values().span()) w *= 10;  // weights of about 0.2: scores far from uniform
  const auto x = test::random_tensor({2, t, dim}, 6, 2.0);
  const auto y = attn(Var<double>(x, false)).value();
  for (std::int64_t b = 0; b < 2; ++b) {
    const auto want = llama_attention_reference(x.data() + b * t * dim, t, dim, n_head, n_kv_head, 500000.0,
                                                attn.q_proj.weight.var().value().data(),
                                                attn.k_proj.weight.var().value().data(),
                                                attn.v_proj.weight.var().value().data(),
                                                attn.o_proj.weight.var().value().data());
    for (std::int64_t i = 0; i < t * dim; ++i) CHECK(y.data()[b * t * dim + i] == Approx(want[std::size_t(i)]).margin(1e-12));
  }
  CHECK_THROWS_WITH(GroupedQueryAttention<double>(dim, 4, 3), Catch::Contains("multiple of n_kv_head"));
  CHECK_THROWS_WITH(GroupedQueryAttention<double>(18, 4, 2), Catch::Contains("not a multiple of n_head"));
}
