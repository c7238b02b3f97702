// The fused causal attention kernels (tensor/cuda/flash_attention.hpp) against an oracle that
// shares no code with them: attention written out in double, straight from its definition,
// on the same 16-bit inputs. Outputs start poisoned (NaN), so an element never written fails.
// Shapes that are not multiples of the kernels' tiles, one position, head dimensions 16 to 128,
// grouped-query heads, misaligned rows (no 16-byte packs) and accumulated gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "polyshard/tensor/cuda/flash_attention.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/transfer.hpp"
#include "support/error_of.hpp"
#include "support/gpu_compare.hpp"

using namespace polyshard;
namespace pc = polyshard::cuda;

namespace {

struct Case {
  std::int64_t b, t, n_head, n_kv_head, d;
  std::size_t offset = 0;  // elements before every buffer: 1 misaligns every row
};

/// Positions of a fused projection (B, T, (H + 2 Hkv) D): q heads, then k heads, then v heads.
struct Layout {
  Case c;
  std::int64_t stride() const { return (c.n_head + 2 * c.n_kv_head) * c.d; }
  std::int64_t out_stride() const { return c.n_head * c.d; }
  std::size_t q(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) const {
    return std::size_t((b * c.t + t) * stride() + h * c.d + i);
  }
  std::size_t k(std::int64_t b, std::int64_t t, std::int64_t kvh, std::int64_t i) const {
    return std::size_t((b * c.t + t) * stride() + (c.n_head + kvh) * c.d + i);
  }
  std::size_t v(std::int64_t b, std::int64_t t, std::int64_t kvh, std::int64_t i) const {
    return std::size_t((b * c.t + t) * stride() + (c.n_head + c.n_kv_head + kvh) * c.d + i);
  }
  std::size_t o(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) const {
    return std::size_t((b * c.t + t) * out_stride() + h * c.d + i);
  }
  pc::AttentionShape shape() const {
    return {.batch = c.b, .seq = c.t, .n_head = c.n_head, .n_kv_head = c.n_kv_head, .head_dim = c.d,
            .stride = stride(), .out_stride = out_stride()};
  }
};

struct Oracle {
  std::vector<double> out, lse, dqkv;  // dqkv in the projection's layout
};

/// Attention by its definition, in double: for each query row, p = softmax(q k^T / sqrt(D)) over
/// keys up to the row, out = p v; backward dv = p^T dout, dp = dout v^T, ds = p (dp - sum(p dp)),
/// dq = ds k / sqrt(D), dk = ds^T q / sqrt(D), each key-value head summing its group's heads.
template <class T>
Oracle attention_in_double(const Layout& L, const std::vector<T>& qkv, const std::vector<T>& dout) {
  const Case& c = L.c;
  const std::int64_t group = c.n_head / c.n_kv_head;
  const double scale = 1.0 / std::sqrt(double(c.d));
  Oracle r;
  r.out.assign(std::size_t(c.b * c.t * L.out_stride()), 0.0);
  r.lse.assign(std::size_t(c.b * c.n_head * c.t), 0.0);
  r.dqkv.assign(qkv.size(), 0.0);
  auto x = [&](std::size_t i) { return double(float(qkv[i])); };
  auto g = [&](std::size_t i) { return double(float(dout[i])); };
  for (std::int64_t b = 0; b < c.b; ++b)
    for (std::int64_t h = 0; h < c.n_head; ++h) {
      const std::int64_t kvh = h / group;
      for (std::int64_t i = 0; i < c.t; ++i) {
        std::vector<double> p(std::size_t(i + 1)), dp(std::size_t(i + 1));
        double top = -INFINITY;
        for (std::int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (std::int64_t e = 0; e < c.d; ++e) s += x(L.q(b, i, h, e)) * x(L.k(b, j, kvh, e));
          p[std::size_t(j)] = s * scale;
          top = std::max(top, s * scale);
        }
        double sum = 0;
        for (double& pj : p) sum += (pj = std::exp(pj - top));
        for (double& pj : p) pj /= sum;
        r.lse[std::size_t((b * c.n_head + h) * c.t + i)] = top + std::log(sum);
        for (std::int64_t e = 0; e < c.d; ++e) {
          double o = 0;
          for (std::int64_t j = 0; j <= i; ++j) o += p[std::size_t(j)] * x(L.v(b, j, kvh, e));
          r.out[L.o(b, i, h, e)] = o;
        }
        double p_dot_dp = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (std::int64_t e = 0; e < c.d; ++e) s += g(L.o(b, i, h, e)) * x(L.v(b, j, kvh, e));
          dp[std::size_t(j)] = s;
          p_dot_dp += p[std::size_t(j)] * s;
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const double pj = p[std::size_t(j)], ds = pj * (dp[std::size_t(j)] - p_dot_dp);
          for (std::int64_t e = 0; e < c.d; ++e) {
            r.dqkv[L.v(b, j, kvh, e)] += pj * g(L.o(b, i, h, e));
            r.dqkv[L.q(b, i, h, e)] += ds * scale * x(L.k(b, j, kvh, e));
            r.dqkv[L.k(b, j, kvh, e)] += ds * scale * x(L.q(b, i, h, e));
          }
        }
      }
    }
  return r;
}

template <class T>
std::vector<T> rounded(const std::vector<double>& v) {
  std::vector<T> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = T(float(v[i]));
  return r;
}

template <class T, class W>
void check_against(const std::string& what, const std::vector<T>& got, const std::vector<W>& want, double slack) {
  const double err = test::relative_error(std::span<const T>(got), std::span<const W>(want));
  INFO(what << ": relative error " << err << " (bound " << test::gpu_tolerance<T>() * slack << ")");
  CHECK(err <= test::gpu_tolerance<T>() * slack);
}

template <class T>
void check_case(const Case& c, bool accumulate) {
  const Layout L{c};
  INFO("B " << c.b << ", T " << c.t << ", heads " << c.n_head << "/" << c.n_kv_head << ", D " << c.d << ", offset "
            << c.offset << (accumulate ? ", accumulating" : ""));
  const std::size_t n_qkv = std::size_t(c.b * c.t * L.stride()), n_out = std::size_t(c.b * c.t * L.out_stride());
  const auto qkv = test::random_values<T>(n_qkv, 7 + std::uint64_t(c.t), 2.0);  // scores of a few units: peaked rows
  const auto dout = test::random_values<T>(n_out, 8 + std::uint64_t(c.d));
  const auto before = test::random_values<T>(n_qkv, 9);  // what an accumulated gradient adds to
  const Oracle want = attention_in_double(L, qkv, dout);

  const auto q = test::offset_copy(qkv, c.offset);
  auto out = test::offset_poisoned<T>(n_out, c.offset);
  auto lse = test::poisoned_device<float>(want.lse.size());
  const pc::AttentionShape shape = L.shape();
  const std::int64_t kv = c.n_head * c.d, vv = (c.n_head + c.n_kv_head) * c.d;
  pc::flash_attention_forward(q.get(), q.get() + kv, q.get() + vv, out.get(), lse.data(), shape, nullptr);
  const std::vector<T> out_host = out.to_host();
  check_against("out", out_host, want.out, 1.0);
  check_against("lse", lse.to_host(), want.lse, 1e-3 / test::gpu_tolerance<float>());

  const auto out_dev = test::offset_copy(out_host, c.offset), dout_dev = test::offset_copy(dout, c.offset);
  auto dqkv = accumulate ? test::offset_copy(before, c.offset) : test::offset_poisoned<T>(n_qkv, c.offset);
  auto workspace = test::poisoned_device<float>(std::size_t(pc::flash_attention_backward_workspace_floats(shape)));
  auto backward = [&] {
    pc::flash_attention_backward(q.get(), q.get() + kv, q.get() + vv, out_dev.get(), dout_dev.get(), lse.data(),
                                 pc::DeviceGradOut<T>{dqkv.get(), accumulate},
                                 pc::DeviceGradOut<T>{dqkv.get() + kv, accumulate},
                                 pc::DeviceGradOut<T>{dqkv.get() + vv, accumulate}, workspace.data(), shape, nullptr);
  };
  backward();
  std::vector<double> want_grad = want.dqkv;
  if (accumulate)
    for (std::size_t i = 0; i < n_qkv; ++i) want_grad[i] += double(float(before[i]));
  // Every probability and its gradient passes through T before its product, as on any 16-bit
  // tensor-core attention: a few roundings of T more than the forward.
  const std::vector<T> grad = dqkv.to_host();
  check_against("dqkv", grad, want_grad, 4.0);

  // Sums in a fixed order: the same inputs give the same bits.
  if (!accumulate) {
    backward();
    CHECK(dqkv.to_host() == grad);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("fused causal attention matches attention computed in double, forward and backward",
                   "[cuda][tensor][attention]", half, bfloat16) {
  // (B, T, heads, key-value heads, D): T off the tiles' multiples (32 and 64), one position,
  // several tiles, head dimensions 16, 32, 64 and 128, grouped-query heads.
  check_case<TestType>({1, 1, 2, 2, 64}, false);
  check_case<TestType>({2, 37, 3, 3, 16}, false);
  check_case<TestType>({2, 70, 2, 2, 64}, false);
  check_case<TestType>({1, 45, 2, 2, 128}, false);
  check_case<TestType>({1, 33, 4, 2, 32}, false);
  check_case<TestType>({1, 40, 4, 1, 16}, false);
  // Enough tiles that both stages of shared memory are written over (copies of the next tile in
  // flight while one is used), tiles wholly inside the causal mask and past it, and key-value
  // heads whose query heads' tiles run in one stream.
  check_case<TestType>({1, 100, 4, 2, 128}, false);
  check_case<TestType>({1, 130, 3, 1, 64}, false);
  // Misaligned rows take the element-by-element loads; gradients added to what is there.
  check_case<TestType>({1, 35, 2, 2, 32, 1}, false);
  check_case<TestType>({2, 19, 2, 1, 64}, true);
}

TEST_CASE("fused causal attention on GPT-2's qkv matches the materialized device kernels",
          "[cuda][tensor][attention]") {
  // The two device paths of causal_self_attention on the same bf16 input: the fused kernels
  // and the materialized ones (cuBLASLt products around the causal softmax).
  const std::int64_t b = 2, t = 50, n_head = 2, d = 64, c = n_head * d;
  const auto qkv_host = test::random_values<bfloat16>(std::size_t(b * t * 3 * c), 31, 2.0);
  const auto dout_host = test::random_values<bfloat16>(std::size_t(b * t * c), 32);
  const auto qkv = to_device(Tensor<bfloat16>::from({b, t, 3 * c}, std::span<const bfloat16>(qkv_host)));
  const auto dout = to_device(Tensor<bfloat16>::from({b, t, c}, std::span<const bfloat16>(dout_host)));
  REQUIRE(fused_attention_supports(qkv, int(n_head)));

  auto out = Tensor<bfloat16, Cuda>::empty({b, t, c});
  auto lse = Tensor<float, Cuda>::empty({b, n_head, t});
  auto dqkv = Tensor<bfloat16, Cuda>::empty({b, t, 3 * c});
  causal_self_attention_fused_forward(qkv, int(n_head), out, lse);
  causal_self_attention_fused_backward(qkv, out, lse, dout, int(n_head), GradOut<bfloat16, Cuda>{dqkv});

  auto out_ref = Tensor<bfloat16, Cuda>::empty({b, t, c});
  auto att = Tensor<bfloat16, Cuda>::empty({b, n_head, t, t});
  auto dqkv_ref = Tensor<bfloat16, Cuda>::empty({b, t, 3 * c});
  causal_self_attention_forward(qkv, int(n_head), out_ref, att);
  causal_self_attention_backward(qkv, att, dout, int(n_head), GradOut<bfloat16, Cuda>{dqkv_ref});

  const auto host = [](const Tensor<bfloat16, Cuda>& x) { return to_host(x).to_vector(); };
  check_against("out", host(out), host(out_ref), 1.0);
  check_against("dqkv", host(dqkv), host(dqkv_ref), 4.0);
}

TEST_CASE("fused causal attention refuses what it does not compute, naming it", "[cuda][tensor][attention]") {
  pc::AttentionShape shape{.batch = 1, .seq = 4, .n_head = 2, .n_kv_head = 2, .head_dim = 48, .stride = 288,
                           .out_stride = 96};
  CHECK_THAT(test::error_of([&] { pc::flash_attention_forward<bfloat16>(nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                                                                  nullptr); }),
             Catch::Contains("head dimension 48"));
  shape.head_dim = 64;
  shape.n_kv_head = 3;
  CHECK_THAT(test::error_of([&] { pc::flash_attention_forward<half>(nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                                                              nullptr); }),
             Catch::Contains("2 query heads do not share 3 key-value heads"));
  shape.n_kv_head = 2;
  shape.out_stride = 100;
  CHECK_THAT(test::error_of([&] { pc::flash_attention_forward<half>(nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                                                              nullptr); }),
             Catch::Contains("output stride 100"));
  CHECK_FALSE(pc::flash_attention_supports(8));
  CHECK(pc::flash_attention_supports(128));
}

namespace {

/// Columns [from, from + width) of every position of the fused layout, as a (B, T, width) tensor.
template <class T, class V>
std::vector<V> columns(const Layout& L, const std::vector<T>& fused, std::int64_t from, std::int64_t width) {
  std::vector<V> r;
  for (std::int64_t p = 0; p < L.c.b * L.c.t; ++p)
    for (std::int64_t e = 0; e < width; ++e) r.push_back(V(fused[std::size_t(p * L.stride() + from + e)]));
  return r;
}

template <class T>
Tensor<T, Cuda> device_tensor(const std::vector<T>& v, Shape shape) {
  return to_device(Tensor<T>::from(std::move(shape), std::span<const T>(v)));
}

template <class T>
std::vector<T> host_values(const Tensor<T, Cuda>& t) {
  const Tensor<T> h = to_host(t);
  return std::vector<T>(h.data(), h.data() + h.numel());
}

}  // namespace

TEMPLATE_TEST_CASE("grouped attention over separate q, k and v reads the key-value heads in place and matches "
                   "attention computed in double",
                   "[cuda][tensor][attention]", half, bfloat16) {
  // The op Llama's blocks call: q (B, T, H D), k and v (B, T, Hkv D) each a tensor of its own,
  // so keys and values have a stride of their own. The oracle is the fused layout's, split.
  for (const Case c : {Case{2, 37, 4, 2, 64}, Case{1, 70, 6, 2, 32}, Case{1, 33, 4, 1, 128}, Case{1, 20, 3, 3, 16}}) {
    const Layout L{c};
    INFO("B " << c.b << ", T " << c.t << ", heads " << c.n_head << "/" << c.n_kv_head << ", D " << c.d);
    const auto qkv = test::random_values<TestType>(std::size_t(c.b * c.t * L.stride()), 17 + std::uint64_t(c.t), 2.0);
    const auto dout = test::random_values<TestType>(std::size_t(c.b * c.t * L.out_stride()), 18);
    const Oracle want = attention_in_double(L, qkv, dout);
    const std::int64_t hq = c.n_head * c.d, hkv = c.n_kv_head * c.d;
    const Shape q_shape{c.b, c.t, hq}, kv_shape{c.b, c.t, hkv};
    const auto q = device_tensor(columns<TestType, TestType>(L, qkv, 0, hq), q_shape);
    const auto k = device_tensor(columns<TestType, TestType>(L, qkv, hq, hkv), kv_shape);
    const auto v = device_tensor(columns<TestType, TestType>(L, qkv, hq + hkv, hkv), kv_shape);
    REQUIRE(grouped_fused_attention_supports(q, k, v, int(c.n_head), int(c.n_kv_head)));
    auto out = Tensor<TestType, Cuda>::empty(q_shape);
    auto lse = Tensor<float, Cuda>::empty({c.b, c.n_head, c.t});
    grouped_attention_fused_forward(q, k, v, int(c.n_head), int(c.n_kv_head), out, lse);
    check_against("out", host_values(out), want.out, 1.0);
    check_against("lse", host_values(lse), want.lse, 1e-3 / test::gpu_tolerance<float>());

    // dq and dk written, dv added to what is there (the kernel writes dk and dv alike: dv goes
    // through scratch).
    const auto before = test::random_values<TestType>(std::size_t(c.b * c.t * hkv), 19);
    auto dq = Tensor<TestType, Cuda>::empty(q_shape), dk = Tensor<TestType, Cuda>::empty(kv_shape);
    auto dv = device_tensor(before, kv_shape);
    grouped_attention_fused_backward(q, k, v, out, lse, device_tensor(dout, q_shape), int(c.n_head), int(c.n_kv_head),
                                     GradOut<TestType, Cuda>{dq, false}, GradOut<TestType, Cuda>{dk, false},
                                     GradOut<TestType, Cuda>{dv, true});
    std::vector<double> want_dv = columns<double, double>(L, want.dqkv, hq + hkv, hkv);
    for (std::size_t i = 0; i < want_dv.size(); ++i) want_dv[i] += double(float(before[i]));
    check_against("dq", host_values(dq), columns<double, double>(L, want.dqkv, 0, hq), 4.0);
    check_against("dk", host_values(dk), columns<double, double>(L, want.dqkv, hq, hkv), 4.0);
    check_against("dv", host_values(dv), want_dv, 4.0);
  }
}

TEST_CASE("grouped attention refuses key-value heads that do not divide the query heads, naming them",
          "[cuda][tensor][attention]") {
  const auto q = Tensor<bfloat16, Cuda>::empty({1, 4, 6 * 16}), kv = Tensor<bfloat16, Cuda>::empty({1, 4, 4 * 16});
  auto out = Tensor<bfloat16, Cuda>::empty({1, 4, 6 * 16});
  auto lse = Tensor<float, Cuda>::empty({1, 6, 4});
  CHECK_FALSE(grouped_fused_attention_supports(q, kv, kv, 6, 4));
  CHECK(test::error_of([&] { grouped_attention_fused_forward(q, kv, kv, 6, 4, out, lse); })
            .find("with 6 query heads and 4 key-value heads") != std::string::npos);
}
