// The tape on device tensors: a GPT-shaped graph (embedding, layer norm, attention, MLP with
// GELU, residual adds, cross-entropy) and a Llama-style layer (RMSNorm, rotary grouped-query
// attention, SwiGLU) run forward and backward on the GPU and on the host from the same values;
// every leaf's gradient and the loss agree within the element type's bound.
// Checkpoints with DeepSpeed's single-rank settings: inputs kept in host memory, boundaries synchronized.
#include <algorithm>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "support/finite_difference.hpp"
#include "support/gpu_compare.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/transfer.hpp"
#include "polyshard/autograd/backward.hpp"
#include "polyshard/autograd/checkpoint.hpp"
#include "polyshard/autograd/ops.hpp"

using namespace polyshard;
using test::random_ids;

namespace {
/// The leaves of a one-block GPT on device D, from the same host values whatever D.
template <Device D>
struct Leaves {
  Var<float, D> wte, ln_w, ln_b, attn_w, attn_b, fc_w, fc_b, proj_w;
};
template <Device D>
Var<float, D> leaf(const Tensor<float>& host) {
  if constexpr (std::same_as<D, Cpu>) return Var<float, D>(host.clone(), true);
  else return Var<float, D>(to_device(host), true);
}
template <Device D>
Leaves<D> make_leaves(int v, int c) {
  return {leaf<D>(test::random_floats(Shape{v, c}, 1, 0.5)),      leaf<D>(test::random_floats(Shape{c}, 2, 1.0)),
          leaf<D>(test::random_floats(Shape{c}, 3, 0.1)),         leaf<D>(test::random_floats(Shape{3 * c, c}, 4, 0.2)),
          leaf<D>(test::random_floats(Shape{3 * c}, 5, 0.1)),     leaf<D>(test::random_floats(Shape{4 * c, c}, 6, 0.2)),
          leaf<D>(test::random_floats(Shape{4 * c}, 7, 0.1)),     leaf<D>(test::random_floats(Shape{c, 4 * c}, 8, 0.1))};
}

/// loss of one pre-norm block with a tied head: the same code for both devices.
template <Device D>
Var<float, D> block_loss(const Leaves<D>& p, const Tensor<std::int32_t, D>& ids, const Tensor<std::int32_t, D>& targets,
                         int n_head) {
  const Var<float, D> x = embedding(ids, p.wte);                                       // (B, T, C)
  const Var<float, D> h = layer_norm(x, p.ln_w, p.ln_b);                               // (B, T, C)
  const Var<float, D> a = causal_self_attention(linear(h, p.attn_w, p.attn_b), n_head);  // (B, T, C)
  const Var<float, D> r = x + a;
  const Var<float, D> m = linear(gelu(linear(r, p.fc_w, p.fc_b)), p.proj_w);           // (B, T, C)
  const Var<float, D> logits = linear(r + scale(m, 0.5), p.wte);                       // (B, T, V), tied
  return cross_entropy(logits, targets);
}

void check_grad(const char* what, const Var<float, Cuda>& got, const Var<float, Cpu>& want) {
  REQUIRE(got.grad().defined());
  const auto g = got.grad().to_vector();
  const auto w = want.grad().to_vector();
  const double err = test::relative_error(std::span<const float>(g), std::span<const float>(w));
  INFO(what << ": relative error " << err);
  CHECK(err <= 5e-5);  // fp32 through a dozen kernels whose reduction orders differ from the CPU's
}
}  // namespace

TEST_CASE("a GPT block's forward and backward on the GPU match the host's", "[cuda][autograd]") {
  const int v = 61, c = 32, n_head = 4;
  const auto ids = random_ids(Shape{2, 17}, v, 9), targets = random_ids(Shape{2, 17}, v, 10);
  const Leaves<Cpu> host = make_leaves<Cpu>(v, c);
  const Leaves<Cuda> device = make_leaves<Cuda>(v, c);
  const auto host_loss = block_loss(host, ids, targets, n_head);
  const auto device_loss = block_loss(device, to_device(ids), to_device(targets), n_head);
  CHECK(detail::scalar_value(device_loss.value()) == Approx(detail::scalar_value(host_loss.value())).epsilon(1e-5));
  backward(host_loss);
  backward(device_loss);
  check_grad("wte (embedding and tied head)", device.wte, host.wte);
  check_grad("ln weight", device.ln_w, host.ln_w);
  check_grad("ln bias", device.ln_b, host.ln_b);
  check_grad("attention weight", device.attn_w, host.attn_w);
  check_grad("attention bias", device.attn_b, host.attn_b);
  check_grad("fc weight", device.fc_w, host.fc_w);
  check_grad("fc bias", device.fc_b, host.fc_b);
  check_grad("proj weight", device.proj_w, host.proj_w);
}

TEST_CASE("gradients accumulate over two backward passes on the GPU as on the host", "[cuda][autograd]") {
  const auto w_host = test::random_floats(Shape{5, 7}, 11, 1.0), x_host = test::random_floats(Shape{3, 7}, 12, 1.0);
  Var<float, Cpu> w(w_host.clone(), true);
  Var<float, Cuda> dw(to_device(w_host), true);
  const Var<float, Cpu> x(x_host.clone());
  const Var<float, Cuda> dx(to_device(x_host));
  for (int pass = 0; pass < 2; ++pass) {
    backward(mean(mul(linear(x, w), linear(x, w))));
    backward(mean(mul(linear(dx, dw), linear(dx, dw))));
  }
  check_grad("accumulated weight gradient", dw, w);
}

namespace {
/// The leaves of a Llama-style layer on device D: RMSNorm, grouped-query attention (4 query heads
/// of 8, 2 key-value heads) with rotary embeddings, SwiGLU with bias-free projections, and its input.
template <Device D>
struct LlamaLeaves {
  Var<float, D> x, norm_w, wq, wk, wv, wo, w1, w2, w3;
};
template <Device D>
LlamaLeaves<D> make_llama_leaves(int c, int hidden) {
  auto w = [](Shape s, std::uint64_t seed, double scale) { return leaf<D>(test::random_floats(s, seed, scale)); };
  return {w({2, 17, c}, 11, 2.0), w({c}, 12, 1.0),           w({c, c}, 16, 0.3),          w({c / 2, c}, 17, 0.3),
          w({c / 2, c}, 18, 0.3), w({c, c}, 19, 0.3),         w({hidden, c}, 13, 0.3),     w({c, hidden}, 14, 0.3),
          w({hidden, c}, 15, 0.3)};
}
/// h = rms_norm(x); r = x + attention(h) (rotary q and k at positions from 3, key-value heads
/// shared by pairs of query heads); r + w2(silu(w1 r) * w3 r), reduced to a scalar: the same
/// code for both devices.
template <Device D>
Var<float, D> llama_loss(const LlamaLeaves<D>& p) {
  const Var<float, D> h = rms_norm(p.x, p.norm_w, 1e-6);                                              // (B, T, C)
  const Var<float, D> q = reshape(rope(reshape(linear(h, p.wq), {2, 17, 4, 8}), 10000.0, 3), {2, 17, 32});
  const Var<float, D> k = reshape(rope(reshape(linear(h, p.wk), {2, 17, 2, 8}), 10000.0, 3), {2, 17, 16});
  const Var<float, D> a = grouped_causal_self_attention(q, k, linear(h, p.wv), 4, 2);                // (B, T, C)
  const Var<float, D> r = p.x + linear(a, p.wo);                                                     // (B, T, C)
  const Var<float, D> gate = mul(silu(linear(r, p.w1)), linear(r, p.w3));                            // (B, T, H)
  const Var<float, D> y = r + linear(gate, p.w2);                                                    // (B, T, C)
  return mean(mul(y, y));
}
}  // namespace

TEST_CASE("Llama's blocks (RMSNorm, rotary grouped-query attention, SwiGLU) on the GPU match the host's",
          "[cuda][autograd]") {
  const LlamaLeaves<Cpu> host = make_llama_leaves<Cpu>(32, 48);
  const LlamaLeaves<Cuda> device = make_llama_leaves<Cuda>(32, 48);
  const auto host_loss = llama_loss(host);
  const auto device_loss = llama_loss(device);
  CHECK(detail::scalar_value(device_loss.value()) == Approx(detail::scalar_value(host_loss.value())).epsilon(1e-5));
  backward(host_loss);
  backward(device_loss);
  check_grad("input", device.x, host.x);
  check_grad("rms_norm weight", device.norm_w, host.norm_w);
  check_grad("q_proj", device.wq, host.wq);
  check_grad("k_proj", device.wk, host.wk);
  check_grad("v_proj", device.wv, host.wv);
  check_grad("o_proj", device.wo, host.wo);
  check_grad("w1 (gate)", device.w1, host.w1);
  check_grad("w2 (down)", device.w2, host.w2);
  check_grad("w3 (up)", device.w3, host.w3);
}

TEST_CASE("grouped-query attention on bf16 device tensors reads the key-value heads in place, as repeating them does",
          "[cuda][autograd]") {
  // grouped_causal_self_attention's fused path (the kernels read each key-value head for its
  // group of query heads) against the same attention over repeated key-value heads (grouped_qkv,
  // then causal_self_attention, on the same kernels): the loss and the gradients agree up to
  // bf16's rounding (the repeated path sums each group's key-value gradients in bf16, the fused
  // one in float). Multi-head (4/4) and multi-query (4/1) attention too.
  const std::int64_t b = 2, t = 19, d = 32;
  for (const auto& [n_head, n_kv_head] : {std::pair{4, 2}, std::pair{4, 1}, std::pair{4, 4}}) {
    INFO(n_head << " query heads, " << n_kv_head << " key-value heads");
    const auto bf16 = [](const Tensor<float>& host) { return Var<bfloat16, Cuda>(cast<bfloat16>(to_device(host)), true); };
    const auto q_host = test::random_floats(Shape{b, t, n_head * d}, 41, 1.0);
    const auto k_host = test::random_floats(Shape{b, t, n_kv_head * d}, 42, 1.0);
    const auto v_host = test::random_floats(Shape{b, t, n_kv_head * d}, 43, 1.0);
    const Var<bfloat16, Cuda> weights(cast<bfloat16>(to_device(test::random_floats(Shape{b, t, n_head * d}, 44, 1.0))));
    struct Run {
      Var<bfloat16, Cuda> q, k, v;
      double loss;
    };
    const auto run = [&](bool in_place) {
      Run r{bf16(q_host), bf16(k_host), bf16(v_host), 0.0};
      REQUIRE(grouped_fused_attention_applies(r.q.value(), r.k.value(), r.v.value(), n_head, n_kv_head));
      const Var<bfloat16, Cuda> a =
          in_place ? grouped_causal_self_attention(r.q, r.k, r.v, n_head, n_kv_head)
                   : causal_self_attention(grouped_qkv(r.q, r.k, r.v, n_head, n_kv_head), n_head);
      CHECK(a.node()->op == std::string(in_place ? "grouped_causal_self_attention" : "causal_self_attention"));
      const Var<bfloat16, Cuda> loss = mean(mul(a, weights));
      r.loss = loss.item();
      backward(loss);
      return r;
    };
    const Run fused = run(true), repeated = run(false);
    CHECK(fused.loss == Approx(repeated.loss).epsilon(1e-2).margin(1e-4));
    const auto close = [](const char* what, const Var<bfloat16, Cuda>& got, const Var<bfloat16, Cuda>& want) {
      const auto g = to_host(cast<float>(got.grad())), w = to_host(cast<float>(want.grad()));
      const double err = test::relative_error(std::span<const float>(g.span()), std::span<const float>(w.span()));
      INFO(what << ": relative error " << err);
      CHECK(err <= 2e-2);  // a few bf16 roundings (2^-8 each) apart
    };
    close("dq", fused.q, repeated.q);
    close("dk", fused.k, repeated.k);
    close("dv", fused.v, repeated.v);
  }
}

TEST_CASE("linear_cross_entropy on the GPU matches the head and loss as two ops on the host", "[cuda][autograd]") {
  // Vocabularies off the padding's multiple of 64 (61 pads to 64, 130 to 192); the weight is also
  // the embedding's, so its head gradient adds to the embedding's; a seed other than 1 reaches the
  // logits' gradient through the device scalar alone.
  // 64 needs no padding: the weight gradient's product then writes it directly.
  const int c = 32;
  for (const int v : {61, 64, 130}) {
    INFO("vocabulary " << v);
    const auto ids = random_ids(Shape{2, 9}, v, 21), targets = random_ids(Shape{2, 9}, v, 22);
    const auto w_host = test::random_floats(Shape{v, c}, 23, 0.5), s_host = test::random_floats(Shape{c}, 24, 1.0);
    const auto b_host = test::random_floats(Shape{c}, 25, 0.1);
    Var<float, Cpu> w(w_host.clone(), true), s(s_host.clone(), true), b(b_host.clone(), true);
    Var<float, Cuda> dw(to_device(w_host), true), ds(to_device(s_host), true), db(to_device(b_host), true);
    const auto host_loss = linear_cross_entropy(layer_norm(embedding(ids, w), s, b), w, targets);
    const auto device_loss =
        linear_cross_entropy(layer_norm(embedding(to_device(ids), dw), ds, db), dw, to_device(targets));
    CHECK(detail::scalar_value(device_loss.value()) == Approx(detail::scalar_value(host_loss.value())).epsilon(1e-6));
    backward(host_loss, 3.0);
    backward(device_loss, 3.0);
    check_grad("weight (embedding and head)", dw, w);
    check_grad("layer norm weight before the head", ds, s);
    check_grad("layer norm bias before the head", db, b);
    // A second pass adds to the gradients: the head's weight gradient now lands on one already
    // there (through scratch and an add, where the vocabulary is padded).
    backward(linear_cross_entropy(w, w, random_ids(Shape{v}, v, 26)));
    backward(linear_cross_entropy(dw, dw, to_device(random_ids(Shape{v}, v, 26))));
    check_grad("weight after a second pass", dw, w);
  }
}

TEST_CASE("linear_cross_entropy on the GPU takes a seed past fp16's range through the root's factor",
          "[cuda][autograd]") {
  // backward(loss, 2^17) on a half graph: the root holds 1 and the seed rides as its grad_factor,
  // which the op folds into the logits' gradient; the result is 2^17 times the seed-1 gradient.
  const int v = 61, c = 16;
  const auto ids = random_ids(Shape{3, 5}, v, 31), targets = random_ids(Shape{3, 5}, v, 32);
  const auto w_host = test::random_floats(Shape{v, c}, 33, 0.5);
  const auto w_half = cast<half>(to_device(w_host));
  const auto gradient = [&](double seed) {
    Var<half, Cuda> w(w_half.clone(), true);
    backward(linear_cross_entropy(embedding(to_device(ids), w), w, to_device(targets)), seed);
    return to_host(cast<float>(w.grad()));
  };
  const auto once = gradient(1.0), scaled = gradient(131072.0);
  std::vector<float> want(once.span().begin(), once.span().end());
  for (float& x : want) x *= 131072.0f;
  const double err = test::relative_error(std::span<const float>(scaled.span()), std::span<const float>(want));
  INFO("relative error " << err);
  CHECK(err <= 2e-3);  // each gradient rounded to half once, at its own scale
}

TEST_CASE("linear_cross_entropy_forward leaves zeros in its logits' padding, which the backward's products read",
          "[cuda][autograd]") {
  // A buffer that starts as NaN everywhere (as never-written device memory may): after the
  // forward through the padded weight its columns past V are zeros, the rest the logits of
  // linear_forward. The padded weight is the weight and zero rows. 9001 columns: a thread of the
  // kernel that keeps its row in registers holds three packs, then the row's last element.
  const std::int64_t v = GENERATE(61, 9001);
  const std::int64_t rows = 6, c = 8, ld = padded_vocab(v);
  const auto x = to_device(test::random_floats(Shape{rows, c}, 41, 1.0));
  const auto w = to_device(test::random_floats(Shape{v, c}, 42, 0.5));
  const auto targets = to_device(random_ids(Shape{rows}, v, 43));
  auto logits = Tensor<float, Cuda>::full(Shape{rows, ld}, std::numeric_limits<float>::quiet_NaN());
  auto lse = Tensor<float, Cuda>::empty(Shape{rows});
  auto loss = Tensor<float, Cuda>::empty(Shape{});
  const auto head = padded_head_weight(w);
  REQUIRE(head.shape() == Shape{ld, c});
  const auto head_values = head.to_vector(), w_values = w.to_vector();
  CHECK(std::vector<float>(head_values.begin(), head_values.begin() + v * c) == w_values);
  CHECK(std::all_of(head_values.begin() + v * c, head_values.end(), [](float e) { return e == 0.0f; }));
  linear_cross_entropy_forward(x, head, v, targets, logits, lse, loss);
  auto want = Tensor<float, Cuda>::empty(Shape{rows, v});
  linear_forward(x, w, Tensor<float, Cuda>(), want);
  const auto got = logits.to_vector(), reference = want.to_vector();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t k = 0; k < v; ++k)
      CHECK(got[std::size_t(r * ld + k)] == Approx(reference[std::size_t(r * v + k)]).epsilon(1e-5));
    for (std::int64_t k = v; k < ld; ++k) CHECK(got[std::size_t(r * ld + k)] == 0.0f);
  }
  // With the gradient in place, the same pass leaves softmax - onehot over the first V columns
  // (from the logits above, in double) and the padding's zeros, and the same loss.
  const float loss_plain = loss.to_vector()[0];
  logits.fill(std::numeric_limits<float>::quiet_NaN());
  linear_cross_entropy_forward(x, head, v, targets, logits, Tensor<float, Cuda>(), loss, /*gradient_in_place=*/true);
  CHECK(loss.to_vector()[0] == loss_plain);
  const auto grad = logits.to_vector();
  const auto target_ids = targets.to_vector();
  for (std::int64_t r = 0; r < rows; ++r) {
    double top = -1e300, total = 0;
    for (std::int64_t k = 0; k < v; ++k) top = std::max(top, double(reference[std::size_t(r * v + k)]));
    for (std::int64_t k = 0; k < v; ++k) total += std::exp(double(reference[std::size_t(r * v + k)]) - top);
    for (std::int64_t k = 0; k < v; ++k) {
      const double p = std::exp(double(reference[std::size_t(r * v + k)]) - top) / total;
      const double want_grad = p - (k == target_ids[std::size_t(r)] ? 1.0 : 0.0);
      CHECK(grad[std::size_t(r * ld + k)] == Approx(want_grad).margin(1e-6));
    }
    for (std::int64_t k = v; k < ld; ++k) CHECK(grad[std::size_t(r * ld + k)] == 0.0f);
  }
}

TEST_CASE("gelu_mlp on the GPU matches linear, gelu and linear on the host", "[cuda][autograd]") {
  // 64 hidden units take the epilogues (bias + GELU + aux forward, dGELU backward); 20 is not a
  // multiple of 8, which cuBLASLt's aux needs, and takes the separate passes. x also feeds the
  // residual, so its gradient is added to; a second pass adds to every gradient.
  const auto [c, h] = GENERATE(std::pair{16, 64}, std::pair{6, 20});
  INFO("width " << c << ", hidden " << h);
  const auto x_host = test::random_floats(Shape{2, 5, c}, 61, 1.0);
  const auto r_host = test::random_floats(Shape{2, 5, c}, 62, 1.0);
  const auto fc_w = test::random_floats(Shape{h, c}, 63, 0.3), fc_b = test::random_floats(Shape{h}, 64, 0.3);
  const auto proj_w = test::random_floats(Shape{c, h}, 65, 0.3), proj_b = test::random_floats(Shape{c}, 66, 0.3);
  const auto loss_of = [&](auto&& x, auto&& w1, auto&& b1, auto&& w2, auto&& b2, auto&& r) {
    return mean(mul(add(gelu_mlp(x, w1, b1, w2, b2), x), r));
  };
  Var<float, Cpu> hx(x_host.clone(), true), hw1(fc_w.clone(), true), hb1(fc_b.clone(), true),
      hw2(proj_w.clone(), true), hb2(proj_b.clone(), true);
  Var<float, Cuda> dx(to_device(x_host), true), dw1(to_device(fc_w), true), db1(to_device(fc_b), true),
      dw2(to_device(proj_w), true), db2(to_device(proj_b), true);
  const Var<float, Cpu> hr(r_host.clone());
  const Var<float, Cuda> dr(to_device(r_host));
  for (int pass = 0; pass < 2; ++pass) {
    INFO("pass " << pass);
    const auto host_loss = loss_of(hx, hw1, hb1, hw2, hb2, hr);
    const auto device_loss = loss_of(dx, dw1, db1, dw2, db2, dr);
    CHECK(detail::scalar_value(device_loss.value()) == Approx(detail::scalar_value(host_loss.value())).epsilon(1e-5));
    backward(host_loss);
    backward(device_loss);
    check_grad("x", dx, hx);
    check_grad("fc weight", dw1, hw1);
    check_grad("fc bias", db1, hb1);
    check_grad("proj weight", dw2, hw2);
    check_grad("proj bias", db2, hb2);
  }
}

TEST_CASE("gelu_mlp in bf16 on the GPU matches the three ops on the GPU", "[cuda][autograd]") {
  // The fused op against the unfused path of the same device and precision: GPT-2's 4x hidden
  // width, whose epilogues the model's MLPs take.
  const int c = 32, h = 128;
  const auto bf16 = [](const Tensor<float>& host) {
    return Var<bfloat16, Cuda>(cast<bfloat16>(to_device(host)), true);
  };
  const auto values = std::vector<Tensor<float>>{
      test::random_floats(Shape{3, 7, c}, 71, 1.0), test::random_floats(Shape{h, c}, 72, 0.3),
      test::random_floats(Shape{h}, 73, 0.3), test::random_floats(Shape{c, h}, 74, 0.3),
      test::random_floats(Shape{c}, 75, 0.3)};
  const Var<bfloat16, Cuda> r(cast<bfloat16>(to_device(test::random_floats(Shape{3, 7, c}, 76, 1.0))));
  std::vector<Var<bfloat16, Cuda>> fused, unfused;
  for (const auto& v : values) fused.push_back(bf16(v)), unfused.push_back(bf16(v));
  const auto& f = fused;
  const auto& u = unfused;
  const Var<bfloat16, Cuda> fused_loss = mean(mul(gelu_mlp(f[0], f[1], f[2], f[3], f[4]), r));
  const Var<bfloat16, Cuda> unfused_loss = mean(mul(linear(gelu(linear(u[0], u[1], u[2])), u[3], u[4]), r));
  CHECK(float(detail::scalar_value(fused_loss.value())) ==
        Approx(float(detail::scalar_value(unfused_loss.value()))).epsilon(2e-2));
  backward(fused_loss);
  backward(unfused_loss);
  const char* names[] = {"x", "fc weight", "fc bias", "proj weight", "proj bias"};
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto got = to_host(cast<float>(fused[i].grad())), want = to_host(cast<float>(unfused[i].grad()));
    const double err = test::relative_error(std::span<const float>(got.span()), std::span<const float>(want.span()));
    INFO(names[i] << ": relative error " << err);
    CHECK(err <= 2e-2);  // a few bf16 roundings (2^-8 each) apart
  }
}

TEST_CASE("linear_cross_entropy on the GPU gives the same loss with and without recording", "[cuda][autograd]") {
  // Recording, the forward also writes the gradient in place; under NoGradGuard it writes the
  // loss alone. bf16, whose logits take the in-place gradient.
  const int v = 130, c = 24;
  const auto ids = to_device(random_ids(Shape{4, 7}, v, 51)), targets = to_device(random_ids(Shape{4, 7}, v, 52));
  Var<bfloat16, Cuda> w(cast<bfloat16>(to_device(test::random_floats(Shape{v, c}, 53, 0.5))), true);
  const double recorded = detail::scalar_value(linear_cross_entropy(embedding(ids, w), w, targets).value());
  double plain = 0;
  {
    NoGradGuard no_grad;
    const auto loss = linear_cross_entropy(embedding(ids, w), w, targets);
    CHECK_FALSE(loss.requires_grad());
    plain = detail::scalar_value(loss.value());
  }
  CHECK(recorded == plain);
  CHECK(std::isfinite(plain));
}

namespace {
/// A stack of `blocks.size()` residual blocks, x + gelu(linear(layer_norm(x), w)), each one
/// checkpointed, on device tensors; the loss is the mean square of the last output.
struct CheckpointedStack {
  std::vector<Var<float, Cuda>> weights;
  Var<float, Cuda> ln_w, ln_b;
  Var<float, Cuda> forward(const Var<float, Cuda>& x0) const {
    Var<float, Cuda> x = x0;
    for (const Var<float, Cuda>& w : weights)
      x = checkpoint([&](const Var<float, Cuda>& in) { return in + gelu(linear(layer_norm(in, ln_w, ln_b), w)); },
                     x);
    return x;
  }
};
/// `n_blocks` blocks of width 16, their values drawn from seeds `seed` on.
CheckpointedStack narrow_stack(int n_blocks, std::uint64_t seed) {
  CheckpointedStack stack{{}, leaf<Cuda>(test::random_floats(Shape{16}, seed, 1.0)),
                          leaf<Cuda>(test::random_floats(Shape{16}, seed + 1, 0.1))};
  for (int k = 0; k < n_blocks; ++k)
    stack.weights.push_back(leaf<Cuda>(test::random_floats(Shape{16, 16}, seed + 2 + k, 0.3)));
  return stack;
}
std::uint64_t device_bytes_in_use() {
  POLYSHARD_CUDA_CHECK(cudaDeviceSynchronize());  // frees are ordered on the stream
  return cuda::DeviceMemoryPool::current().used_bytes();
}
}  // namespace

TEST_CASE("cpu_checkpointing keeps each checkpoint's input in host memory until its recomputation, with the "
          "gradients of keeping it on the device",
          "[cuda][autograd]") {
  const int n_blocks = 4;
  const Shape shape{2, 8, 64};  // 4,096 bytes of float: a whole number of the pool's blocks
  const std::int64_t input_bytes = shape.numel() * 4;
  const Tensor<float> x_host = test::random_floats(shape, 61, 1.0);
  CheckpointedStack stack{{}, leaf<Cuda>(test::random_floats(Shape{64}, 62, 1.0)),
                          leaf<Cuda>(test::random_floats(Shape{64}, 63, 0.1))};
  for (int k = 0; k < n_blocks; ++k)
    stack.weights.push_back(leaf<Cuda>(test::random_floats(Shape{64, 64}, 70 + k, 0.2)));
  // One run's gradients (the input's, then each weight's) and the device bytes its forward kept.
  struct Run {
    std::vector<std::vector<float>> grads;
    std::int64_t forward_bytes = 0;
    CheckpointCounts counts;
  };
  const auto run = [&](bool offload) {
    Run r;
    for (auto& w : stack.weights) w.zero_grad();
    Var<float, Cuda> x(to_device(x_host), true);
    const std::uint64_t before = device_bytes_in_use();
    Var<float, Cuda> loss;
    {
      CheckpointSettingsScope settings({.cpu_checkpointing = offload});
      const Var<float, Cuda> y = stack.forward(x);
      loss = mean(mul(y, y));
      r.counts = settings.counts();
    }
    r.forward_bytes = static_cast<std::int64_t>(device_bytes_in_use()) - static_cast<std::int64_t>(before);
    if (offload) {
      // The first block's input is released until backward: reading it is an error naming the setting.
      CHECK_THROWS_WITH(x.value().to_vector(), Catch::Contains("cpu_checkpointing"));
    }
    backward(loss);
    CHECK(x.value().to_vector() == x_host.to_vector());  // back on the device, unchanged
    r.grads.push_back(x.grad().to_vector());
    for (const auto& w : stack.weights) r.grads.push_back(w.grad().to_vector());
    return r;
  };
  const Run kept = run(false), offloaded = run(true);
  CHECK(kept.counts.checkpoints == n_blocks);
  CHECK(kept.counts.inputs_offloaded == 0);
  CHECK(offloaded.counts.inputs_offloaded == n_blocks);
  CHECK(offloaded.counts.bytes_offloaded == n_blocks * input_bytes);
  // Every block's input left the device: the first (x), and the outputs of all blocks but the last.
  CHECK(kept.forward_bytes - offloaded.forward_bytes == n_blocks * input_bytes);
  // The recomputation read exactly the values it would have read on the device.
  REQUIRE(offloaded.grads.size() == kept.grads.size());
  for (std::size_t i = 0; i < kept.grads.size(); ++i) CHECK(offloaded.grads[i] == kept.grads[i]);
}

TEST_CASE("cpu_checkpointing brings each input back while the block after it recomputes, one block ahead",
          "[cuda][autograd]") {
  const int n_blocks = 4;
  std::vector<Var<float, Cuda>> weights;
  for (int k = 0; k < n_blocks; ++k) weights.push_back(leaf<Cuda>(test::random_floats(Shape{16, 16}, 90 + k, 0.3)));
  // Each block's input as its forward saw it (the handle keeps the storage, not its elements), and
  // for each recomputation, which inputs had device memory as it began.
  std::vector<Tensor<float, Cuda>> inputs;
  std::vector<std::vector<bool>> on_device_at_recomputation(n_blocks);
  Var<float, Cuda> x(to_device(test::random_floats(Shape{3, 16}, 95, 1.0)), true);
  Var<float, Cuda> loss;
  {
    CheckpointSettingsScope settings({.cpu_checkpointing = true});
    Var<float, Cuda> h = x;
    for (int k = 0; k < n_blocks; ++k) {
      inputs.push_back(h.value());
      h = checkpoint(
          [&, k](const Var<float, Cuda>& in) {
            if (grad_enabled())  // the recomputation: forward runs without recording
              for (const auto& t : inputs) on_device_at_recomputation[k].push_back(t.storage()->materialized());
            return gelu(linear(in, weights[k]));
          },
          h);
    }
    loss = mean(h);
  }
  for (const auto& t : inputs) CHECK_FALSE(t.storage()->materialized());  // all in host memory after forward
  backward(loss);
  // Block k recomputes with its own input back and block k-1's coming, the earlier ones still away
  // (the later ones came back before, and the handles here keep them).
  for (int k = 0; k < n_blocks; ++k) {
    INFO("recomputation of block " << k);
    REQUIRE(on_device_at_recomputation[k].size() == static_cast<std::size_t>(n_blocks));
    for (int j = 0; j < n_blocks; ++j) CHECK(on_device_at_recomputation[k][j] == (j >= k - 1));
  }
}

TEST_CASE("contiguous_memory_optimization puts a forward's moved inputs in one buffer, sized by the forward "
          "before and never one a live graph still reads",
          "[cuda][autograd]") {
  const int n_blocks = 3;
  const CheckpointedStack stack = narrow_stack(n_blocks, 101);
  const CheckpointSettings contiguous{.cpu_checkpointing = true, .contiguous_memory_optimization = true};
  // A forward of its own batch (seed) under `settings`: its loss, to run backward on later, and
  // what its checkpoints did.
  struct Forward {
    Var<float, Cuda> x, loss;
    CheckpointCounts counts;
  };
  const auto forward = [&](std::uint64_t seed, const CheckpointSettings& settings) {
    Forward f;
    f.x = Var<float, Cuda>(to_device(test::random_floats(Shape{5, 16}, seed, 1.0)), true);
    CheckpointSettingsScope scope(settings);
    f.loss = mean(stack.forward(stack.forward(f.x)));  // the stack twice over: six inputs moved
    f.counts = scope.counts();
    return f;
  };
  // The input gradient of seed's batch with the inputs kept on the device: the oracle.
  const auto kept_grad = [&](std::uint64_t seed) {
    Forward f = forward(seed, {});
    backward(f.loss);
    return f.x.grad().to_vector();
  };
  Forward first = forward(110, contiguous);
  CHECK(first.counts.inputs_offloaded == 2 * n_blocks);
  CHECK(first.counts.inputs_in_one_buffer == 0);  // the first forward measures
  backward(first.loss);
  CHECK(first.x.grad().to_vector() == kept_grad(110));
  // Two forwards before their backwards (micro-batches): the first takes the buffer, the second,
  // finding it held by a live graph, places its inputs elsewhere and its values stay its own.
  Forward a = forward(111, contiguous), b = forward(112, contiguous);
  CHECK(a.counts.inputs_in_one_buffer == 2 * n_blocks);
  CHECK(b.counts.inputs_in_one_buffer == 2 * n_blocks);  // a new buffer, the size a asked for
  backward(b.loss);
  backward(a.loss);
  CHECK(a.x.grad().to_vector() == kept_grad(111));
  CHECK(b.x.grad().to_vector() == kept_grad(112));
  // Without cpu_checkpointing there is nothing to place: refused, naming both.
  CHECK_THROWS_WITH(CheckpointSettingsScope({.contiguous_memory_optimization = true}),
                    Catch::Contains("contiguous_memory_optimization") && Catch::Contains("cpu_checkpointing is false"));
}

TEST_CASE("number_checkpoints sizes contiguous_memory_optimization's buffer from the first forward, as many inputs "
          "as it says",
          "[cuda][autograd]") {
  const int n_blocks = 3;
  const CheckpointedStack stack = narrow_stack(n_blocks, 201);
  POLYSHARD_CUDA_CHECK(cudaDeviceSynchronize());  // the weights are there for the threads' streams
  // The stack twice over, each forward on a thread of its own (a buffer per thread): six inputs
  // moved, the first forward of that thread; its last copy to the host waits for all its work.
  const auto run = [&](std::uint64_t seed, const CheckpointSettings& settings) {
    std::pair<CheckpointCounts, std::vector<float>> out;
    std::thread([&] {
      Var<float, Cuda> x(to_device(test::random_floats(Shape{5, 16}, seed, 1.0)), true);
      Var<float, Cuda> loss;
      {
        CheckpointSettingsScope scope(settings);
        loss = mean(stack.forward(stack.forward(x)));
        out.first = scope.counts();
      }
      backward(loss);
      out.second = x.grad().to_vector();
    }).join();
    return out;
  };
  const std::vector<float> kept = run(210, {}).second;
  for (const std::int64_t slots : {std::int64_t{2 * n_blocks}, std::int64_t{8}, std::int64_t{n_blocks}}) {
    INFO("number_checkpoints " << slots);
    const auto [counts, grad] = run(210, {.cpu_checkpointing = true, .contiguous_memory_optimization = true,
                                          .number_checkpoints = slots});
    CHECK(counts.inputs_offloaded == 2 * n_blocks);
    // All six where the buffer holds them; with three slots, the first three, the rest on their own.
    CHECK(counts.inputs_in_one_buffer == std::min<std::int64_t>(slots, 2 * n_blocks));
    CHECK(grad == kept);
  }
  // Without contiguous_memory_optimization it sizes nothing: refused, naming both; so is a negative count.
  CHECK_THROWS_WITH(CheckpointSettingsScope({.cpu_checkpointing = true, .number_checkpoints = 4}),
                    Catch::Contains("number_checkpoints (4)") && Catch::Contains("contiguous_memory_optimization"));
  CHECK_THROWS_WITH(CheckpointSettingsScope({.cpu_checkpointing = true, .contiguous_memory_optimization = true,
                                             .number_checkpoints = -1}),
                    Catch::Contains("number_checkpoints (-1)"));
}

TEST_CASE("synchronize_checkpoint_boundary waits for the device as each checkpoint's forward and recomputation "
          "begin and end",
          "[cuda][autograd]") {
  CheckpointedStack stack{{leaf<Cuda>(test::random_floats(Shape{16, 16}, 81, 0.2)),
                           leaf<Cuda>(test::random_floats(Shape{16, 16}, 82, 0.2))},
                          leaf<Cuda>(test::random_floats(Shape{16}, 83, 1.0)),
                          leaf<Cuda>(test::random_floats(Shape{16}, 84, 0.1))};
  const Var<float, Cuda> x(to_device(test::random_floats(Shape{3, 16}, 85, 1.0)), true);
  const std::int64_t before = checkpoint_boundary_synchronizations();
  Var<float, Cuda> loss;
  {
    CheckpointSettingsScope settings({.synchronize_boundary = true});
    loss = mean(stack.forward(x));
  }
  CHECK(checkpoint_boundary_synchronizations() - before == 2 * 2);  // two blocks, each begun and ended
  backward(loss);
  CHECK(checkpoint_boundary_synchronizations() - before == 4 * 2);  // and each recomputation
  {
    // Without the setting, none.
    const std::int64_t quiet = checkpoint_boundary_synchronizations();
    backward(mean(stack.forward(x)));
    CHECK(checkpoint_boundary_synchronizations() == quiet);
  }
}
