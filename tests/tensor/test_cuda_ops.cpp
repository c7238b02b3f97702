// The tensor ops on Tensor<T, Cuda> against the same ops on host tensors: the wrappers pass the
// right shapes, strides and gradient modes to the kernels, and refuse what the CPU ops refuse.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "support/finite_difference.hpp"
#include "support/gpu_compare.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/transfer.hpp"
#include "polyshard/tensor/ops.hpp"

using namespace polyshard;
using test::random_ids;

namespace {
/// A device tensor poisoned with NaN, for an op's output.
template <class T>
Tensor<T, Cuda> poisoned(const Shape& shape) {
  auto t = Tensor<T, Cuda>::empty(shape);
  REQUIRE(cudaMemsetAsync(t.data(), 0xFF, t.bytes(), cuda::current_stream()) == cudaSuccess);
  return t;
}
template <class T>
void check_tensor(const char* what, const Tensor<T, Cuda>& got, const Tensor<float>& want, double slack = 1.0) {
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector();
  const auto w = want.to_vector();
  const double err = test::relative_error(std::span<const T>(g), std::span<const float>(w));
  INFO(what << ": relative error " << err);
  CHECK(err <= test::gpu_tolerance<T>() * slack);
}
/// The host tensor rounded to T and back, so that both sides start from the same values.
template <class T>
Tensor<float> rounded(const Tensor<float>& x) {
  return cast<float>(cast<T>(x));
}
}  // namespace

TEMPLATE_TEST_CASE("a transformer block's ops on device tensors match the host ops", "[cuda][tensor]", float,
                   bfloat16) {
  const Shape shape{3, 5, 40};  // (B, T, C)
  const auto x = rounded<TestType>(test::random_floats(shape, 1));
  const auto w = rounded<TestType>(test::random_floats(Shape{40}, 2));
  const auto b = rounded<TestType>(test::random_floats(Shape{40}, 3));
  const auto dy = rounded<TestType>(test::random_floats(shape, 4));
  const auto dx_x = to_device(cast<TestType>(x)), dw = to_device(cast<TestType>(w)), db = to_device(cast<TestType>(b));
  const auto ddy = to_device(cast<TestType>(dy));

  // Layer norm, forward and backward with every gradient wanted, dbias accumulating.
  auto y = Tensor<float>::empty(shape), mean = Tensor<float>::empty(Shape{3, 5}), rstd = Tensor<float>::empty(Shape{3, 5});
  layer_norm_forward(x, w, b, 1e-5, y, mean, rstd);
  auto gy = poisoned<TestType>(shape);
  auto gmean = poisoned<float>(Shape{3, 5}), grstd = poisoned<float>(Shape{3, 5});
  layer_norm_forward(dx_x, dw, db, 1e-5, gy, gmean, grstd);
  check_tensor("layer_norm y", gy, y, 2);
  check_tensor("layer_norm rstd", grstd, rstd, 2);

  auto hx = Tensor<float>::empty(shape), hw = Tensor<float>::empty(Shape{40}), hb = Tensor<float>::full(Shape{40}, 0.5f);
  layer_norm_backward(x, w, mean, rstd, dy, GradOut<float>{hx}, GradOut<float>{hw}, GradOut<float>{hb, true});
  auto ghx = poisoned<TestType>(shape), ghw = poisoned<TestType>(Shape{40});
  auto ghb = to_device(Tensor<TestType>::full(Shape{40}, TestType(0.5f)));
  layer_norm_backward(dx_x, dw, gmean, grstd, ddy, GradOut<TestType, Cuda>{ghx}, GradOut<TestType, Cuda>{ghw},
                      GradOut<TestType, Cuda>{ghb, true});
  check_tensor("layer_norm dx", ghx, hx, 4);
  check_tensor("layer_norm dweight", ghw, hw, 4);
  check_tensor("layer_norm dbias (accumulated)", ghb, hb, 4);

  // GELU and a residual add.
  auto g = Tensor<float>::empty(shape);
  gelu_forward(x, g);
  auto gg = poisoned<TestType>(shape);
  gelu_forward(dx_x, gg);
  check_tensor("gelu", gg, g, 2);
  auto gsum = poisoned<TestType>(shape);
  add_into(dx_x, ddy, gsum);
  check_tensor("add", gsum, add(x, dy));

  // A bias gradient.
  auto bias_grad = poisoned<TestType>(Shape{40});
  column_sum(ddy, GradOut<TestType, Cuda>{bias_grad});
  auto want = Tensor<float>::zeros(Shape{40});
  for (std::int64_t r = 0; r < 15; ++r)
    for (std::int64_t c = 0; c < 40; ++c) want.at(c) += dy.data()[r * 40 + c];
  check_tensor("column_sum", bias_grad, want, 4);
}

TEMPLATE_TEST_CASE("embedding and cross-entropy on device tensors match the host ops", "[cuda][tensor]", float,
                   bfloat16) {
  const auto table = rounded<TestType>(test::random_floats(Shape{37, 16}, 5));
  const auto ids = random_ids(Shape{4, 9}, 37, 6);
  auto out = Tensor<float>::empty(Shape{4, 9, 16});
  embedding_forward(ids, table, out);
  const auto gids = to_device(ids);
  auto gout = poisoned<TestType>(Shape{4, 9, 16});
  embedding_forward(gids, to_device(cast<TestType>(table)), gout);
  check_tensor("embedding", gout, out);

  const auto logits = rounded<TestType>(test::random_floats(Shape{6, 101}, 7, 3.0));
  const auto targets = random_ids(Shape{6}, 101, 8);
  auto losses = Tensor<float>::empty(Shape{6}), lse = Tensor<float>::empty(Shape{6});
  cross_entropy_forward(logits, targets, losses, lse);
  auto dlogits = Tensor<float>::empty(Shape{6, 101});
  cross_entropy_backward(logits, targets, lse, Tensor<float>::full(Shape{6}, 1.0f / 6), GradOut<float>{dlogits});

  const auto glogits = to_device(cast<TestType>(logits));
  auto glosses = poisoned<float>(Shape{6});
  auto gdlogits = poisoned<TestType>(Shape{6, 101});
  cross_entropy_fused(glogits, to_device(targets), glosses, 1.0f / 6, GradOut<TestType, Cuda>{gdlogits});
  check_tensor("cross_entropy losses", glosses, losses, 2);
  check_tensor("cross_entropy dlogits", gdlogits, dlogits, 2);
}

TEMPLATE_TEST_CASE("matmul on device tensors takes the same views as the host matmul", "[cuda][tensor]", float,
                   bfloat16) {
  const auto a = rounded<TestType>(test::random_floats(Shape{2, 3, 24, 40}, 9));
  const auto b = rounded<TestType>(test::random_floats(Shape{40, 16}, 10));
  const auto bb = rounded<TestType>(test::random_floats(Shape{2, 3, 40, 16}, 11));
  const auto ga = to_device(cast<TestType>(a)), gb = to_device(cast<TestType>(b)), gbb = to_device(cast<TestType>(bb));
  // A tall product with a shared B, a batched one, and transposed views on both sides.
  check_tensor("shared B", matmul(ga, gb), matmul(a, b), 2);
  check_tensor("batched B", matmul(ga, gbb), matmul(a, bb), 2);
  const auto at = a.transpose().contiguous(), gat = to_device(cast<TestType>(at));  // (2, 3, 40, 24)
  check_tensor("transposed A", matmul(gat.transpose(), gbb), matmul(at.transpose(), bb), 2);
  check_tensor("transposed B", matmul(ga, gbb.transpose().contiguous().transpose()), matmul(a, bb), 2);
  // beta = 1 accumulates into C.
  auto c = to_device(cast<TestType>(matmul(a, b)));
  matmul_into(ga, gb, c, 1.0f, 1.0f);
  check_tensor("accumulate", c, scale(matmul(a, b), 2.0), 2);
}

TEMPLATE_TEST_CASE("linear forward and backward on device tensors match the host twins, with the bias folded into "
                   "the products or not",
                   "[cuda][tensor]", float, bfloat16) {
  const std::int64_t rows = 37, in = 40, out = 24;  // rows not a multiple of 8
  const auto x = rounded<TestType>(test::random_floats(Shape{rows, in}, 21));
  const auto w = rounded<TestType>(test::random_floats(Shape{out, in}, 22));
  const auto b = rounded<TestType>(test::random_floats(Shape{out}, 23));
  const auto dy = rounded<TestType>(test::random_floats(Shape{rows, out}, 24));
  const auto gx = to_device(cast<TestType>(x)), gw = to_device(cast<TestType>(w)), gdy = to_device(cast<TestType>(dy));
  // The bias (and its gradient) where a pool block starts, 16-byte aligned: the epilogues take
  // them; one element further in: the separate passes do. Both must give the same sums.
  const bool aligned = GENERATE(true, false);
  CAPTURE(aligned);
  const std::int64_t at = aligned ? 0 : 1;
  auto bias_block = Tensor<TestType, Cuda>::zeros(Shape{out + 1});
  const auto gb = bias_block.flat_view(at, out);
  copy_across(cast<TestType>(b), gb);

  auto y = Tensor<float>::empty(Shape{rows, out});
  linear_forward(x, w, b, y);
  auto gy = poisoned<TestType>(y.shape());
  linear_forward(gx, gw, gb, gy);
  check_tensor("y", gy, y, 2);

  // Every gradient overwritten: the weight gradient's product also sums the bias gradient.
  auto dx = Tensor<float>::empty(x.shape()), dw = Tensor<float>::empty(w.shape()), db = Tensor<float>::empty(b.shape());
  linear_backward(x, w, dy, GradOut<float>{dx}, GradOut<float>{dw}, GradOut<float>{db});
  auto gdx = poisoned<TestType>(x.shape()), gdw = poisoned<TestType>(w.shape());
  auto db_block = poisoned<TestType>(Shape{out + 1});
  const auto gdb = db_block.flat_view(at, out);
  linear_backward(gx, gw, gdy, GradOut<TestType, Cuda>{gdx}, GradOut<TestType, Cuda>{gdw}, GradOut<TestType, Cuda>{gdb});
  check_tensor("dx", gdx, dx, 2);
  check_tensor("dweight", gdw, dw, 4);
  check_tensor("dbias", gdb, db, 4);

  // Accumulating (a second micro-batch): the bias gradient takes its own pass, adding.
  linear_backward(x, w, dy, GradOut<float>{}, GradOut<float>{dw, true}, GradOut<float>{db, true});
  linear_backward(gx, gw, gdy, GradOut<TestType, Cuda>{}, GradOut<TestType, Cuda>{gdw, true},
                  GradOut<TestType, Cuda>{gdb, true});
  check_tensor("dweight, accumulated", gdw, dw, 4);
  check_tensor("dbias, accumulated", gdb, db, 4);

  // Without a bias, and with only the bias gradient wanted.
  linear_forward(x, w, Tensor<float>(), y);
  linear_forward(gx, gw, Tensor<TestType, Cuda>(), gy);
  check_tensor("y without bias", gy, y, 2);
  auto only_db = poisoned<TestType>(Shape{out});
  linear_backward(gx, gw, gdy, GradOut<TestType, Cuda>{}, GradOut<TestType, Cuda>{}, GradOut<TestType, Cuda>{only_db});
  linear_backward(x, w, dy, GradOut<float>{}, GradOut<float>{}, GradOut<float>{db});
  check_tensor("dbias alone", only_db, db, 4);
}

TEMPLATE_TEST_CASE("causal self-attention on device tensors matches the host op, forward and backward",
                   "[cuda][tensor]", float, bfloat16) {
  const int n_head = 4;
  const auto qkv = rounded<TestType>(test::random_floats(Shape{2, 33, 3 * 64}, 12));
  const auto dout = rounded<TestType>(test::random_floats(Shape{2, 33, 64}, 13));
  auto out = Tensor<float>::empty(Shape{2, 33, 64}), att = Tensor<float>::empty(Shape{2, n_head, 33, 33});
  causal_self_attention_forward(qkv, n_head, out, att);
  auto dqkv = Tensor<float>::empty(qkv.shape());
  causal_self_attention_backward(qkv, att, dout, n_head, GradOut<float>{dqkv});

  const auto gqkv = to_device(cast<TestType>(qkv));
  auto gout = poisoned<TestType>(out.shape()), gatt = poisoned<TestType>(att.shape());
  causal_self_attention_forward(gqkv, n_head, gout, gatt);
  check_tensor("attention out", gout, out, 4);
  check_tensor("attention probabilities", gatt, att, 4);
  auto gdqkv = poisoned<TestType>(qkv.shape());
  causal_self_attention_backward(gqkv, gatt, to_device(cast<TestType>(dout)), n_head, GradOut<TestType, Cuda>{gdqkv});
  check_tensor("attention dqkv", gdqkv, dqkv, 8);
}

TEMPLATE_TEST_CASE("mul, add_scaled, bias rows and sums on device tensors match the host", "[cuda][tensor]", float,
                   bfloat16) {
  const Shape shape{7, 129};  // odd sizes: scalar tails and a pack path
  const auto a = rounded<TestType>(test::random_floats(shape, 14)), b = rounded<TestType>(test::random_floats(shape, 15));
  const auto bias = rounded<TestType>(test::random_floats(Shape{129}, 16));
  const auto ga = to_device(cast<TestType>(a)), gb = to_device(cast<TestType>(b));
  check_tensor("mul", mul(ga, gb), mul(a, b));

  auto y = to_device(cast<TestType>(b));
  add_scaled_into(ga, -0.75, y);
  auto want = b.clone();
  add_scaled_into(a, -0.75, want);
  check_tensor("add_scaled", y, want, 2);

  auto rows = to_device(cast<TestType>(a));
  add_bias_into(rows, to_device(cast<TestType>(bias)));
  auto want_rows = a.clone();
  for (std::int64_t r = 0; r < 7; ++r)
    for (std::int64_t c = 0; c < 129; ++c) want_rows.at(r, c) += bias.at(c);
  check_tensor("add_bias", rows, want_rows, 2);

  const double total = sum(ga);
  CHECK(total == Approx(sum(a)).epsilon(1e-6));
  CHECK(sum(ga) == total);  // a fixed order: the same bits again
  CHECK(mean(ga) == Approx(mean(a)).epsilon(1e-6));
}

TEST_CASE("copy_across and cast_across move elements between host and device, converting where the source is",
          "[cuda][tensor]") {
  auto host = Tensor<float>::empty(Shape{4, 9});
  for (std::int64_t i = 0; i < host.numel(); ++i) host.data()[i] = 0.1f * float(i) - 1.7f;
  // Up and back down, through strided host and device views.
  auto device = Tensor<float, Cuda>::full(Shape{4, 9}, NAN);
  copy_across(host, device);
  CHECK(device.to_vector() == host.to_vector());
  auto back = Tensor<float>::full(Shape{9, 4}, NAN);
  copy_across(device.transpose(), back);
  CHECK(back.to_vector() == host.transpose().contiguous().to_vector());
  // float on the host -> bfloat16 on the device: rounded as the host rounds.
  auto narrow = Tensor<bfloat16, Cuda>::full(Shape{4, 9}, bfloat16(NAN));
  cast_across(host, narrow);
  CHECK(narrow.to_vector() == cast<bfloat16>(host).to_vector());
  // bfloat16 on the device -> float on the host: exact.
  auto wide = Tensor<float>::full(Shape{4, 9}, NAN);
  cast_across(narrow, wide);
  CHECK(wide.to_vector() == cast<float>(cast<bfloat16>(host)).to_vector());
  CHECK_THROWS_WITH(copy_across(host, Tensor<float, Cuda>::empty(Shape{9, 4})), Catch::Contains("copy_across"));
}
