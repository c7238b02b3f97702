// The GPT's CUDA kernels against their CPU twins (GPU tests: run where a device exists). Inputs
// are random values rounded to T; the CPU twin runs in float on those same values; outputs are
// poisoned with NaN first, so an element a kernel never writes fails the comparison.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "polyshard/tensor/cuda/transformer_kernels.hpp"
#include "polyshard/tensor/ops.hpp"
#include "support/gpu_compare.hpp"

using namespace polyshard;
namespace pc = polyshard::cuda;

namespace {

template <class T>
std::vector<float> floats(const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  return f;
}

Tensor<float> host_tensor(const Shape& shape, const std::vector<float>& v) {
  return Tensor<float>::from(shape, std::span<const float>(v));
}

Tensor<std::int32_t> cpu_ids(const Shape& shape, const std::vector<std::int32_t>& v) {
  return Tensor<std::int32_t>::from(shape, std::span<const std::int32_t>(v));
}

template <class T>
void check_host(const std::string& what, const std::vector<T>& got, const std::vector<float>& want, double slack = 1.0) {
  const double err = test::relative_error(std::span<const T>(got), std::span<const float>(want));
  INFO(what << ": relative error " << err << " (bound " << test::gpu_tolerance<T>() * slack << ")");
  CHECK(err <= test::gpu_tolerance<T>() * slack);
}

std::vector<std::int32_t> random_ids(std::size_t n, std::int32_t v, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int32_t> u(0, v - 1);
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = u(rng);
  return ids;
}

template <class T>
pc::DeviceGradOut<T> grad_out(T* p, bool accumulate) {
  return {p, accumulate};
}


}  // namespace

// ---- elementwise ----------------------------------------------------------------------------

namespace {
/// An activation's device launchers and CPU twins, for one comparison of both.
struct Gelu {
  static constexpr const char* name = "gelu";
  static constexpr double range = 3.0;  // beyond, gelu(x) of large negative x is too small to compare relatively
  template <class T>
  static void device(const T* x, T* y, std::int64_t n) { pc::gelu_forward(x, y, n, nullptr); }
  template <class T>
  static void device_backward(const T* x, const T* dy, pc::DeviceGradOut<T> dx, std::int64_t n) {
    pc::gelu_backward(x, dy, dx, n, nullptr);
  }
  static void host(const Tensor<float>& x, const Tensor<float>& y) { gelu_forward(x, y); }
  static void host_backward(const Tensor<float>& x, const Tensor<float>& dy, const GradOut<float>& dx) {
    gelu_backward(x, dy, dx);
  }
};
struct Silu {
  static constexpr const char* name = "silu";
  static constexpr double range = 6.0;
  template <class T>
  static void device(const T* x, T* y, std::int64_t n) { pc::silu_forward(x, y, n, nullptr); }
  template <class T>
  static void device_backward(const T* x, const T* dy, pc::DeviceGradOut<T> dx, std::int64_t n) {
    pc::silu_backward(x, dy, dx, n, nullptr);
  }
  static void host(const Tensor<float>& x, const Tensor<float>& y) { silu_forward(x, y); }
  static void host_backward(const Tensor<float>& x, const Tensor<float>& dy, const GradOut<float>& dx) {
    silu_backward(x, dy, dx);
  }
};

/// Activation A's forward and backward kernels against the CPU twins on n elements, `off`
/// elements into their buffers (1: every pointer misaligned for packs); x within A::range.
template <class A, class T>
void check_activation(std::size_t n, std::size_t off, bool accumulate) {
  const auto x = test::random_values<T>(n, 1, A::range), dy = test::random_values<T>(n, 2),
             dx0 = test::random_values<T>(n, 3);
  const Shape s{std::int64_t(n)};
  auto y_dev = test::offset_poisoned<T>(n, off);
  const auto x_dev = test::offset_copy(x, off), dy_dev = test::offset_copy(dy, off);
  A::device(x_dev.get(), y_dev.get(), std::int64_t(n));
  auto want_y = Tensor<float>::empty(s);
  A::host(host_tensor(s, floats(x)), want_y);
  check_host(std::string(A::name) + " y", y_dev.to_host(), want_y.to_vector());

  auto dx = accumulate ? test::offset_copy(dx0, off) : test::offset_poisoned<T>(n, off);
  A::device_backward(x_dev.get(), dy_dev.get(), grad_out(dx.get(), accumulate), std::int64_t(n));
  auto want_dx = host_tensor(s, floats(dx0));
  A::host_backward(host_tensor(s, floats(x)), host_tensor(s, floats(dy)), GradOut<float>{want_dx, accumulate});
  check_host(std::string(A::name) + " dx", dx.to_host(), want_dx.to_vector());
}
}  // namespace

TEMPLATE_TEST_CASE("gelu and silu forward and backward match the CPU twins, with packs and misaligned",
                   "[cuda][tensor]", float, half, bfloat16) {
  const std::size_t n = GENERATE(1, 7, 91, 1000, 4099);
  const std::size_t off = GENERATE(0, 1);
  const bool accumulate = GENERATE(false, true);
  CAPTURE(n, off, accumulate);
  check_activation<Gelu, TestType>(n, off, accumulate);
  check_activation<Silu, TestType>(n, off, accumulate);
}

TEMPLATE_TEST_CASE("add, add_into_accumulate and scale match the CPU twins, with packs and misaligned",
                   "[cuda][tensor]", float, half, bfloat16) {
  using T = TestType;
  const std::size_t n = GENERATE(1, 7, 91, 4099);
  const std::size_t off = GENERATE(0, 1);
  CAPTURE(n, off);
  const Shape s{std::int64_t(n)};
  const auto a = test::random_values<T>(n, 4), b = test::random_values<T>(n, 5);
  const auto a_dev = test::offset_copy(a, off), b_dev = test::offset_copy(b, off);

  // One addition and one rounding on both sides: the results agree to T's last bit.
  auto out = test::offset_poisoned<T>(n, off);
  pc::add_into(a_dev.get(), b_dev.get(), out.get(), std::int64_t(n), nullptr);
  auto want = Tensor<float>::empty(s);
  add_into(host_tensor(s, floats(a)), host_tensor(s, floats(b)), want);
  check_host("add", out.to_host(), want.to_vector());

  auto y = test::offset_copy(b, off);
  pc::add_into_accumulate(a_dev.get(), y.get(), std::int64_t(n), nullptr);
  check_host("add_into_accumulate", y.to_host(), want.to_vector());

  auto scaled = test::offset_poisoned<T>(n, off);
  pc::scale_into(a_dev.get(), -1.5, scaled.get(), std::int64_t(n), nullptr);
  scale_into(host_tensor(s, floats(a)), -1.5, want);
  check_host("scale", scaled.to_host(), want.to_vector());

  // In place: out aliases a.
  auto in_place = test::offset_copy(a, off);
  pc::add_into(in_place.get(), b_dev.get(), in_place.get(), std::int64_t(n), nullptr);
  add_into(host_tensor(s, floats(a)), host_tensor(s, floats(b)), want);
  check_host("add in place", in_place.to_host(), want.to_vector());
}

// ---- grouped-query key-value sharing -----------------------------------------------------------

TEMPLATE_TEST_CASE("grouped_qkv forward and backward match the CPU twin", "[cuda][tensor]", float, half, bfloat16) {
  using T = TestType;
  const auto [n_head, n_kv_head, hd] = GENERATE(std::tuple<std::int64_t, std::int64_t, std::int64_t>{4, 4, 8},
                                                std::tuple<std::int64_t, std::int64_t, std::int64_t>{8, 2, 16},
                                                std::tuple<std::int64_t, std::int64_t, std::int64_t>{6, 1, 5});
  const bool accumulate = GENERATE(false, true);
  CAPTURE(n_head, n_kv_head, hd, accumulate);
  const std::int64_t b = 3, t = 7, c = n_head * hd, ckv = n_kv_head * hd, rows = b * t;
  const Shape qs{b, t, c}, kvs{b, t, ckv}, qkvs{b, t, 3 * c};
  const std::size_t nq = std::size_t(rows * c), nkv = std::size_t(rows * ckv), nqkv = 3 * nq;
  const auto q = test::random_values<T>(nq, 1), k = test::random_values<T>(nkv, 2), v = test::random_values<T>(nkv, 3);
  const auto q_dev = test::device_copy(q), k_dev = test::device_copy(k), v_dev = test::device_copy(v);
  auto qkv_dev = test::poisoned_device<T>(nqkv);
  pc::grouped_qkv_forward(q_dev.data(), k_dev.data(), v_dev.data(), qkv_dev.data(), rows, hd, n_head, n_kv_head, nullptr);
  auto want = Tensor<float>::empty(qkvs);
  grouped_qkv_forward(host_tensor(qs, floats(q)), host_tensor(kvs, floats(k)), host_tensor(kvs, floats(v)),
                      int(n_head), int(n_kv_head), want);
  check_host("grouped_qkv", qkv_dev.to_host(), want.to_vector());

  const auto g = test::random_values<T>(nqkv, 4);
  const auto g_dev = test::device_copy(g);
  const auto dq0 = test::random_values<T>(nq, 5), dk0 = test::random_values<T>(nkv, 6), dv0 = test::random_values<T>(nkv, 7);
  auto dq = accumulate ? test::device_copy(dq0) : test::poisoned_device<T>(nq);
  auto dk = accumulate ? test::device_copy(dk0) : test::poisoned_device<T>(nkv);
  auto dv = accumulate ? test::device_copy(dv0) : test::poisoned_device<T>(nkv);
  pc::grouped_qkv_backward(g_dev.data(), grad_out(dq.data(), accumulate), grad_out(dk.data(), accumulate),
                           grad_out(dv.data(), accumulate), rows, hd, n_head, n_kv_head, nullptr);
  auto want_dq = host_tensor(qs, floats(dq0)), want_dk = host_tensor(kvs, floats(dk0)), want_dv = host_tensor(kvs, floats(dv0));
  grouped_qkv_backward(host_tensor(qkvs, floats(g)), int(n_head), int(n_kv_head), GradOut<float>{want_dq, accumulate},
                       GradOut<float>{want_dk, accumulate}, GradOut<float>{want_dv, accumulate});
  check_host("grouped_qkv dq", dq.to_host(), want_dq.to_vector());
  check_host("grouped_qkv dk", dk.to_host(), want_dk.to_vector(), 2);  // a group's sum, in another order
  check_host("grouped_qkv dv", dv.to_host(), want_dv.to_vector(), 2);
}

// ---- rotary position embedding ----------------------------------------------------------------

TEMPLATE_TEST_CASE("rope forward and backward match the CPU twin", "[cuda][tensor]", float, half, bfloat16) {
  using T = TestType;
  // (B, T, H, D), position offset, accumulate into dx. Two sequences show the positions
  // restarting per sequence. A small case runs each offset with and without accumulating; the
  // larger ones run fewer of the four (the emulated device spends its time per thread), the
  // longest, there for long positions and the widest head, with one sequence, the offset and
  // accumulating.
  using Case = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool>;
  const auto [b, t, h, d, offset, accumulate] =
      GENERATE(Case{2, 1, 1, 2, 0, false}, Case{2, 1, 1, 2, 1000, true}, Case{2, 5, 3, 8, 0, false},
               Case{2, 5, 3, 8, 0, true}, Case{2, 5, 3, 8, 1000, false}, Case{2, 5, 3, 8, 1000, true},
               Case{2, 64, 4, 64, 0, true}, Case{2, 64, 4, 64, 1000, false}, Case{1, 300, 2, 128, 1000, true});
  CAPTURE(b, t, h, d, offset, accumulate);
  const std::size_t n = std::size_t(b * t * h * d);
  const Shape s{b, t, h, d};
  const double theta = 10000.0;
  const auto x = test::random_values<T>(n, 1, 2.0), dy = test::random_values<T>(n, 2), dx0 = test::random_values<T>(n, 3);
  const auto x_dev = test::device_copy(x), dy_dev = test::device_copy(dy);

  auto y_dev = test::poisoned_device<T>(n);
  pc::rope_rotate(x_dev.data(), grad_out(y_dev.data(), false), b, t, h, d, theta, offset, false, nullptr);
  auto want_y = Tensor<float>::empty(s);
  rope_forward(host_tensor(s, floats(x)), theta, offset, want_y);
  check_host("rope y", y_dev.to_host(), want_y.to_vector());

  auto dx_dev = accumulate ? test::device_copy(dx0) : test::poisoned_device<T>(n);
  pc::rope_rotate(dy_dev.data(), grad_out(dx_dev.data(), accumulate), b, t, h, d, theta, offset, true, nullptr);
  auto want_dx = host_tensor(s, floats(dx0));
  rope_backward(host_tensor(s, floats(dy)), theta, offset, GradOut<float>{want_dx, accumulate});
  check_host("rope dx", dx_dev.to_host(), want_dx.to_vector());
}

// ---- RMS norm -------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("rms_norm forward and backward match the CPU twin", "[cuda][tensor]", float, half, bfloat16) {
  using T = TestType;
  const auto [rows, c] = GENERATE(std::pair<std::int64_t, std::int64_t>{1, 8}, std::pair<std::int64_t, std::int64_t>{7, 13},
                                  std::pair<std::int64_t, std::int64_t>{64, 768},
                                  std::pair<std::int64_t, std::int64_t>{300, 37},
                                  std::pair<std::int64_t, std::int64_t>{9000, 24});
  const bool accumulate = GENERATE(false, true);
  CAPTURE(rows, c, accumulate);
  const std::size_t n = std::size_t(rows * c);
  const Shape xs{rows, c}, ws{c}, rs{rows};
  const auto x = test::random_values<T>(n, 6, 2.0), dy = test::random_values<T>(n, 7);
  const auto w = test::random_values<T>(std::size_t(c), 8);
  const auto dx0 = test::random_values<T>(n, 10), dw0 = test::random_values<T>(std::size_t(c), 11);
  const float eps = 1e-6f;

  const auto x_dev = test::device_copy(x), w_dev = test::device_copy(w), dy_dev = test::device_copy(dy);
  auto y_dev = test::poisoned_device<T>(n);
  auto rstd_dev = test::poisoned_device<float>(std::size_t(rows));
  pc::rms_norm_forward(x_dev.data(), w_dev.data(), eps, y_dev.data(), rstd_dev.data(), rows, c, nullptr);
  auto y = Tensor<float>::empty(xs), rstd = Tensor<float>::empty(rs);
  const auto xf = host_tensor(xs, floats(x)), wf = host_tensor(ws, floats(w));
  rms_norm_forward(xf, wf, double(eps), y, rstd);
  // The CPU sums rows in double, the GPU in float across a warp: a few roundings apart.
  test::check_close("rms_norm y", y_dev, y.to_vector(), 4);
  test::check_close("rms_norm rstd", rstd_dev, rstd.to_vector(), 4);

  // Backward from the CPU's statistics, so that only the backward kernels are compared.
  const auto rstd_in = test::device_copy(rstd.to_vector());
  auto dx_dev = accumulate ? test::device_copy(dx0) : test::poisoned_device<T>(n);
  auto dw_dev = accumulate ? test::device_copy(dw0) : test::poisoned_device<T>(std::size_t(c));
  auto work = test::poisoned_device<float>(pc::rms_norm_backward_workspace_floats(rows, c));
  pc::rms_norm_backward(x_dev.data(), w_dev.data(), rstd_in.data(), dy_dev.data(), grad_out(dx_dev.data(), accumulate),
                        grad_out(dw_dev.data(), accumulate), rows, c, work.data(), work.numel(), nullptr);
  auto dx = host_tensor(xs, floats(dx0)), dw = host_tensor(ws, floats(dw0));
  rms_norm_backward(xf, wf, rstd, host_tensor(xs, floats(dy)), GradOut<float>{dx, accumulate},
                    GradOut<float>{dw, accumulate});
  test::check_close("rms_norm dx", dx_dev, dx.to_vector(), 4);
  // dweight: the CPU adds rows one at a time in float, the GPU in chunks of rows.
  test::check_close("rms_norm dweight", dw_dev, dw.to_vector(), 8);

  // Only dweight wanted: dx is null (skipped), and dweight alone comes out the same.
  auto dw_only = test::poisoned_device<T>(std::size_t(c));
  pc::rms_norm_backward(x_dev.data(), w_dev.data(), rstd_in.data(), dy_dev.data(), {}, grad_out(dw_only.data(), false),
                        rows, c, work.data(), work.numel(), nullptr);
  auto dw_fresh = Tensor<float>::empty(ws);
  rms_norm_backward(xf, wf, rstd, host_tensor(xs, floats(dy)), GradOut<float>{}, GradOut<float>{dw_fresh, false});
  test::check_close("rms_norm dweight alone", dw_only, dw_fresh.to_vector(), 8);
}

// ---- layer norm -----------------------------------------------------------------------------

TEMPLATE_TEST_CASE("layer_norm forward and backward match the CPU twin", "[cuda][tensor]", float, half, bfloat16) {
  using T = TestType;
  const auto [rows, c] = GENERATE(std::pair<std::int64_t, std::int64_t>{1, 8}, std::pair<std::int64_t, std::int64_t>{7, 13},
                                  std::pair<std::int64_t, std::int64_t>{64, 768},
                                  std::pair<std::int64_t, std::int64_t>{300, 37},
                                  std::pair<std::int64_t, std::int64_t>{9000, 24});
  const bool accumulate = GENERATE(false, true);
  CAPTURE(rows, c, accumulate);
  const std::size_t n = std::size_t(rows * c);
  const Shape xs{rows, c}, ws{c}, rs{rows};
  const auto x = test::random_values<T>(n, 6, 2.0), dy = test::random_values<T>(n, 7);
  const auto w = test::random_values<T>(std::size_t(c), 8), b = test::random_values<T>(std::size_t(c), 9);
  const auto dx0 = test::random_values<T>(n, 10), dw0 = test::random_values<T>(std::size_t(c), 11),
             db0 = test::random_values<T>(std::size_t(c), 12);
  const float eps = 1e-5f;

  const auto x_dev = test::device_copy(x), w_dev = test::device_copy(w), b_dev = test::device_copy(b),
             dy_dev = test::device_copy(dy);
  auto y_dev = test::poisoned_device<T>(n);
  auto mean_dev = test::poisoned_device<float>(std::size_t(rows)), rstd_dev = test::poisoned_device<float>(std::size_t(rows));
  pc::layer_norm_forward(x_dev.data(), w_dev.data(), b_dev.data(), eps, y_dev.data(), mean_dev.data(), rstd_dev.data(),
                         rows, c, nullptr);
  auto y = Tensor<float>::empty(xs), mean = Tensor<float>::empty(rs), rstd = Tensor<float>::empty(rs);
  const auto xf = host_tensor(xs, floats(x)), wf = host_tensor(ws, floats(w));
  layer_norm_forward(xf, wf, host_tensor(ws, floats(b)), double(eps), y, mean, rstd);
  // The CPU sums rows in double, the GPU in float across a warp: a few roundings apart.
  test::check_close("layer_norm y", y_dev, y.to_vector(), 4);
  test::check_close("layer_norm mean", mean_dev, mean.to_vector(), 4);
  test::check_close("layer_norm rstd", rstd_dev, rstd.to_vector(), 4);

  // Backward from the CPU's statistics, so that only the backward kernels are compared.
  const auto mean_in = test::device_copy(mean.to_vector()), rstd_in = test::device_copy(rstd.to_vector());
  auto dx_dev = accumulate ? test::device_copy(dx0) : test::poisoned_device<T>(n);
  auto dw_dev = accumulate ? test::device_copy(dw0) : test::poisoned_device<T>(std::size_t(c));
  auto db_dev = accumulate ? test::device_copy(db0) : test::poisoned_device<T>(std::size_t(c));
  auto work = test::poisoned_device<float>(pc::layer_norm_backward_workspace_floats(rows, c));
  pc::layer_norm_backward(x_dev.data(), w_dev.data(), mean_in.data(), rstd_in.data(), dy_dev.data(),
                          grad_out(dx_dev.data(), accumulate), grad_out(dw_dev.data(), accumulate),
                          grad_out(db_dev.data(), accumulate), rows, c, work.data(), work.numel(), nullptr);
  auto dx = host_tensor(xs, floats(dx0)), dw = host_tensor(ws, floats(dw0)), db = host_tensor(ws, floats(db0));
  layer_norm_backward(xf, wf, mean, rstd, host_tensor(xs, floats(dy)), GradOut<float>{dx, accumulate},
                      GradOut<float>{dw, accumulate}, GradOut<float>{db, accumulate});
  test::check_close("layer_norm dx", dx_dev, dx.to_vector(), 4);
  // dweight and dbias: the CPU adds rows one at a time in float, the GPU in chunks of rows; the
  // two orders differ by about sqrt(rows) roundings of the running sum.
  test::check_close("layer_norm dweight", dw_dev, dw.to_vector(), 8);
  test::check_close("layer_norm dbias", db_dev, db.to_vector(), 8);

  // Only dbias wanted: dx and dweight are null (skipped), and dbias alone comes out the same.
  auto db_only = test::poisoned_device<T>(std::size_t(c));
  pc::layer_norm_backward(x_dev.data(), w_dev.data(), mean_in.data(), rstd_in.data(), dy_dev.data(), {}, {},
                          grad_out(db_only.data(), false), rows, c, work.data(), work.numel(), nullptr);
  auto db_fresh = Tensor<float>::empty(ws);
  layer_norm_backward(xf, wf, mean, rstd, host_tensor(xs, floats(dy)), GradOut<float>{}, GradOut<float>{},
                      GradOut<float>{db_fresh, false});
  test::check_close("layer_norm dbias alone", db_only, db_fresh.to_vector(), 8);
}

// ---- softmax --------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("softmax forward and backward match the CPU twin", "[cuda][tensor]", float, half, bfloat16) {
  using T = TestType;
  const auto [rows, cols] = GENERATE(std::pair<std::int64_t, std::int64_t>{1, 1}, std::pair<std::int64_t, std::int64_t>{7, 13},
                                     std::pair<std::int64_t, std::int64_t>{5, 1024},
                                     std::pair<std::int64_t, std::int64_t>{3, 50304},
                                     std::pair<std::int64_t, std::int64_t>{2, 50257});
  const bool accumulate = GENERATE(false, true);
  CAPTURE(rows, cols, accumulate);
  const std::size_t n = std::size_t(rows * cols);
  const Shape s{rows, cols};
  const auto x = test::random_values<T>(n, 13, 4.0), dy = test::random_values<T>(n, 14), dx0 = test::random_values<T>(n, 15);

  const auto x_dev = test::device_copy(x);
  auto y_dev = test::poisoned_device<T>(n);
  pc::softmax_forward(x_dev.data(), y_dev.data(), rows, cols, nullptr);
  auto y = Tensor<float>::empty(s);
  softmax_forward(host_tensor(s, floats(x)), y);
  test::check_close("softmax y", y_dev, y.to_vector(), 2);

  // Backward from the same (rounded-to-T) probabilities on both sides.
  const auto y_t = y_dev.to_host();
  const auto y_in = test::device_copy(y_t), dy_dev = test::device_copy(dy);
  auto dx_dev = accumulate ? test::device_copy(dx0) : test::poisoned_device<T>(n);
  pc::softmax_backward(y_in.data(), dy_dev.data(), grad_out(dx_dev.data(), accumulate), rows, cols, nullptr);
  auto dx = host_tensor(s, floats(dx0));
  softmax_backward(host_tensor(s, floats(y_t)), host_tensor(s, floats(dy)), GradOut<float>{dx, accumulate});
  test::check_close("softmax dx", dx_dev, dx.to_vector(), 2);

  // In place: y aliases x.
  auto in_place = test::device_copy(x);
  pc::softmax_forward(in_place.data(), in_place.data(), rows, cols, nullptr);
  test::check_close("softmax in place", in_place, y.to_vector(), 2);
}

TEMPLATE_TEST_CASE("causal softmax forward and backward match row-wise CPU softmax over the visible keys",
                   "[cuda][tensor]", float, half, bfloat16) {
  using T = TestType;
  const std::int64_t bh = 3;
  const std::int64_t t = GENERATE(1, 7, 64, 130);
  const bool accumulate = GENERATE(false, true);
  CAPTURE(t, accumulate);
  const float scale = 1.f / std::sqrt(8.f);
  const std::size_t n = std::size_t(bh * t * t);
  const auto scores = test::random_values<T>(n, 16, 6.0), dp = test::random_values<T>(n, 17),
             ds0 = test::random_values<T>(n, 18);

  const auto s_dev = test::device_copy(scores);
  auto p_dev = test::poisoned_device<T>(n);
  pc::causal_softmax_forward(s_dev.data(), scale, p_dev.data(), bh, t, nullptr);
  const auto p_t = p_dev.to_host();

  std::vector<float> want_p(n, 0.f), want_ds = floats(ds0);
  for (std::int64_t r = 0; r < bh * t; ++r) {
    const std::int64_t q = r % t, vis = q + 1;
    std::vector<float> row(static_cast<std::size_t>(vis)), prow(row.size()), dprow(row.size());
    for (std::int64_t j = 0; j < vis; ++j) {
      row[j] = scale * static_cast<float>(scores[r * t + j]);
      prow[j] = static_cast<float>(p_t[r * t + j]);
      dprow[j] = static_cast<float>(dp[r * t + j]);
    }
    auto y = Tensor<float>::empty({vis});
    softmax_forward(host_tensor({vis}, row), y);
    for (std::int64_t j = 0; j < vis; ++j) want_p[r * t + j] = y.data()[j];
    // Backward from the GPU's probabilities, scaled: the raw scores were multiplied by `scale`.
    auto dx = Tensor<float>::empty({vis});
    softmax_backward(host_tensor({vis}, prow), host_tensor({vis}, dprow), GradOut<float>{dx, false});
    for (std::int64_t j = 0; j < t; ++j) {
      const float g = j < vis ? scale * dx.data()[j] : 0.f;
      want_ds[r * t + j] = accumulate ? want_ds[r * t + j] + g : g;
    }
  }
  test::check_close("causal softmax probs", p_dev, want_p, 2);

  const auto p_in = test::device_copy(p_t), dp_dev = test::device_copy(dp);
  auto ds_dev = accumulate ? test::device_copy(ds0) : test::poisoned_device<T>(n);
  pc::causal_softmax_backward(p_in.data(), dp_dev.data(), scale, grad_out(ds_dev.data(), accumulate), bh, t, nullptr);
  test::check_close("causal softmax dscores", ds_dev, want_ds, 4);
}

// ---- attention layout -----------------------------------------------------------------------

TEMPLATE_TEST_CASE("attention permutes move every element to the CPU attention's qkv layout", "[cuda][tensor]", float,
                   half, bfloat16) {
  using T = TestType;
  const std::int64_t b = 2, t = 5, h = 3;
  const std::int64_t d = GENERATE(7, 8, 64);
  const bool accumulate = GENERATE(false, true);
  CAPTURE(d, accumulate);
  const std::int64_t c = h * d;
  const std::size_t n = std::size_t(b * t * c);
  const auto qkv = test::random_values<T>(3 * n, 19);
  const auto qkv_dev = test::device_copy(qkv);
  auto q = test::poisoned_device<T>(n), k = test::poisoned_device<T>(n), v = test::poisoned_device<T>(n);
  pc::attention_permute_forward(qkv_dev.data(), q.data(), k.data(), v.data(), b, t, h, d, nullptr);

  std::vector<float> want[3] = {std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  std::vector<float> out_want(n);
  const auto y = test::random_values<T>(n, 20);  // (B, H, T, D)
  const auto dqkv0 = test::random_values<T>(3 * n, 21);
  std::vector<float> dqkv_want = floats(dqkv0);
  for (std::int64_t bb = 0; bb < b; ++bb)
    for (std::int64_t hh = 0; hh < h; ++hh)
      for (std::int64_t tt = 0; tt < t; ++tt)
        for (std::int64_t dd = 0; dd < d; ++dd) {
          const std::size_t head_major = std::size_t(((bb * h + hh) * t + tt) * d + dd);
          for (std::int64_t part = 0; part < 3; ++part) {
            const std::size_t src = std::size_t((bb * t + tt) * 3 * c + part * c + hh * d + dd);
            want[part][head_major] = static_cast<float>(qkv[src]);
            // The gradient of part `part` is taken to be qkv's own values, moved back.
            const float g = static_cast<float>(qkv[src]);
            dqkv_want[src] = accumulate ? static_cast<float>(T(dqkv_want[src] + g)) : g;
          }
          out_want[std::size_t((bb * t + tt) * c + hh * d + dd)] = static_cast<float>(y[head_major]);
        }
  // A permutation is exact: no rounding anywhere (accumulation rounds once, as the reference does).
  test::check_close("q", q, want[0], 0);
  test::check_close("k", k, want[1], 0);
  test::check_close("v", v, want[2], 0);

  auto dqkv = accumulate ? test::device_copy(dqkv0) : test::poisoned_device<T>(3 * n);
  pc::attention_permute_backward(q.data(), k.data(), v.data(), grad_out(dqkv.data(), accumulate), b, t, h, d, nullptr);
  test::check_close("dqkv", dqkv, dqkv_want, 0);

  const auto y_dev = test::device_copy(y);
  auto out = test::poisoned_device<T>(n);
  pc::attention_unpermute_forward(y_dev.data(), out.data(), b, t, h, d, nullptr);
  test::check_close("unpermuted", out, out_want, 0);
  auto back = test::poisoned_device<T>(n);
  pc::attention_unpermute_backward(out.data(), back.data(), b, t, h, d, nullptr);
  test::check_close("unpermute backward", back, floats(y), 0);
}

TEST_CASE("permute, causal softmax and unpermute rebuild the CPU attention forward and backward", "[cuda][tensor]") {
  // The batched products that cuBLASLt will do on the GPU are done here on the host, in double.
  const std::int64_t b = 2, t = 17, h = 3, d = 8, c = h * d;
  const float scale = 1.f / std::sqrt(float(d));
  const std::size_t n = std::size_t(b * t * c), nbh = std::size_t(b * h);
  const auto qkv = test::random_values<float>(3 * n, 22), dout = test::random_values<float>(n, 23);
  auto out_cpu = Tensor<float>::empty({b, t, c}), att_cpu = Tensor<float>::empty({b, h, t, t});
  const auto qkv_cpu = host_tensor({b, t, 3 * c}, qkv);
  causal_self_attention_forward(qkv_cpu, int(h), out_cpu, att_cpu);
  auto dqkv_cpu = Tensor<float>::empty({b, t, 3 * c});
  causal_self_attention_backward(qkv_cpu, att_cpu, host_tensor({b, t, c}, dout), int(h), GradOut<float>{dqkv_cpu, false});

  // (BH, T, D) x (BH, T, D)^T or similar, on the host: out[z, i, j] = sum_k a(z, i, k) b(z, j, k).
  auto bmm = [&](const std::vector<float>& x, std::int64_t xi, std::int64_t xk, bool xt, const std::vector<float>& y,
                 std::int64_t yj, std::int64_t yk, bool yt, std::int64_t m, std::int64_t nn, std::int64_t kk) {
    std::vector<float> r(nbh * std::size_t(m * nn));
    for (std::size_t z = 0; z < nbh; ++z)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < nn; ++j) {
          double s = 0;
          for (std::int64_t k = 0; k < kk; ++k) {
            const float a = xt ? x[z * xi * xk + k * xi + i] : x[z * xi * xk + i * xk + k];
            const float bb = yt ? y[z * yj * yk + k * yj + j] : y[z * yj * yk + j * yk + k];
            s += double(a) * bb;
          }
          r[z * std::size_t(m * nn) + std::size_t(i * nn + j)] = float(s);
        }
    return r;
  };

  const auto qkv_dev = test::device_copy(qkv);
  auto q = test::poisoned_device<float>(n), k = test::poisoned_device<float>(n), v = test::poisoned_device<float>(n);
  pc::attention_permute_forward(qkv_dev.data(), q.data(), k.data(), v.data(), b, t, h, d, nullptr);
  const auto qh = q.to_host(), kh = k.to_host(), vh = v.to_host();
  const auto scores = bmm(qh, t, d, false, kh, t, d, false, t, t, d);  // q k^T: (BH, T, T)
  const auto scores_dev = test::device_copy(scores);
  auto probs = test::poisoned_device<float>(nbh * std::size_t(t * t));
  pc::causal_softmax_forward(scores_dev.data(), scale, probs.data(), b * h, t, nullptr);
  // The CPU's products run through BLAS in float, these in double: a few roundings apart.
  test::check_close("attention probabilities", probs, att_cpu.to_vector(), 8);
  const auto ph = probs.to_host();
  const auto yh = bmm(ph, t, t, false, vh, d, t, true, t, d, t);  // P v: (BH, T, D)
  const auto y_dev = test::device_copy(yh);
  auto out = test::poisoned_device<float>(n);
  pc::attention_unpermute_forward(y_dev.data(), out.data(), b, t, h, d, nullptr);
  test::check_close("attention output", out, out_cpu.to_vector(), 8);

  const auto dout_dev = test::device_copy(dout);
  auto dy = test::poisoned_device<float>(n);
  pc::attention_unpermute_backward(dout_dev.data(), dy.data(), b, t, h, d, nullptr);
  const auto dyh = dy.to_host();
  const auto dp = bmm(dyh, t, d, false, vh, t, d, false, t, t, d);   // dy v^T: (BH, T, T)
  const auto dv = bmm(ph, t, t, true, dyh, d, t, true, t, d, t);     // P^T dy: (BH, T, D)
  const auto dp_dev = test::device_copy(dp);
  auto ds = test::poisoned_device<float>(nbh * std::size_t(t * t));
  pc::causal_softmax_backward(probs.data(), dp_dev.data(), scale, grad_out(ds.data(), false), b * h, t, nullptr);
  const auto dsh = ds.to_host();
  const auto dq = bmm(dsh, t, t, false, kh, d, t, true, t, d, t);   // dS k: (BH, T, D)
  const auto dk = bmm(dsh, t, t, true, qh, d, t, true, t, d, t);    // dS^T q: (BH, T, D)
  const auto dq_dev = test::device_copy(dq), dk_dev = test::device_copy(dk), dv_dev = test::device_copy(dv);
  auto dqkv = test::poisoned_device<float>(3 * n);
  pc::attention_permute_backward(dq_dev.data(), dk_dev.data(), dv_dev.data(), grad_out(dqkv.data(), false), b, t, h, d,
                                 nullptr);
  test::check_close("attention dqkv", dqkv, dqkv_cpu.to_vector(), 8);
}

// ---- embedding ------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("embedding forward and backward match the CPU twin, the backward is deterministic",
                   "[cuda][tensor]", float, half, bfloat16) {
  using T = TestType;
  const auto [v, c] = GENERATE(std::pair<std::int64_t, std::int64_t>{50, 13}, std::pair<std::int64_t, std::int64_t>{100, 64},
                               std::pair<std::int64_t, std::int64_t>{1, 8}, std::pair<std::int64_t, std::int64_t>{1000, 768});
  const std::int64_t n = GENERATE(1, 91, 2048);
  const bool accumulate = GENERATE(false, true);
  CAPTURE(v, c, n, accumulate);
  const auto ids = random_ids(std::size_t(n), std::int32_t(v), 24);  // small V: many repeats
  const auto table = test::random_values<T>(std::size_t(v * c), 25), dout = test::random_values<T>(std::size_t(n * c), 26),
             dt0 = test::random_values<T>(std::size_t(v * c), 27);
  const Shape ts{v, c}, os{n, c};

  const auto ids_dev = test::device_copy(ids);
  const auto table_dev = test::device_copy(table), dout_dev = test::device_copy(dout);
  auto out = test::poisoned_device<T>(std::size_t(n * c));
  pc::embedding_forward(ids_dev.data(), table_dev.data(), out.data(), n, v, c, nullptr);
  auto want = Tensor<float>::empty(os);
  embedding_forward(cpu_ids({n}, ids), host_tensor(ts, floats(table)), want);
  test::check_close("embedding out", out, want.to_vector(), 0);

  auto work = test::poisoned_device<unsigned char>(pc::embedding_backward_workspace_bytes(n, v));
  auto run_backward = [&] {
    auto dt = accumulate ? test::device_copy(dt0) : test::poisoned_device<T>(std::size_t(v * c));
    pc::embedding_backward(ids_dev.data(), dout_dev.data(), grad_out(dt.data(), accumulate), n, v, c, work.data(),
                           work.numel(), nullptr);
    return dt.to_host();
  };
  const auto dt1 = run_backward(), dt2 = run_backward();
  auto dt = host_tensor(ts, floats(dt0));
  embedding_backward(cpu_ids({n}, ids), host_tensor(os, floats(dout)), GradOut<float>{dt, accumulate});
  // Each table row adds its positions in increasing order, as the CPU does; the GPU sums them
  // in float first and rounds to T once, the CPU rounds after every addition for T.
  check_host("embedding dtable", dt1, dt.to_vector(), 2);
  CHECK(std::memcmp(dt1.data(), dt2.data(), dt1.size() * sizeof(T)) == 0);
}

TEST_CASE("embedding: an id out of range gives a NaN row forward and is skipped backward", "[cuda][tensor]") {
  const std::int64_t v = 10, c = 16, n = 6;
  const std::vector<std::int32_t> ids = {3, -1, 3, 10, 0, 9};
  const auto table = test::random_values<float>(std::size_t(v * c), 28), dout = test::random_values<float>(std::size_t(n * c), 29);
  const auto ids_dev = test::device_copy(ids);
  const auto table_dev = test::device_copy(table), dout_dev = test::device_copy(dout);
  auto out = test::poisoned_device<float>(std::size_t(n * c));
  pc::embedding_forward(ids_dev.data(), table_dev.data(), out.data(), n, v, c, nullptr);
  const auto got = out.to_host();
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < c; ++j) {
      const float g = got[std::size_t(i * c + j)];
      if (ids[i] < 0 || ids[i] >= v) CHECK(std::isnan(g));
      else CHECK(g == table[std::size_t(ids[i] * c + j)]);
    }

  auto work = test::poisoned_device<unsigned char>(pc::embedding_backward_workspace_bytes(n, v));
  auto dt = test::poisoned_device<float>(std::size_t(v * c));
  pc::embedding_backward(ids_dev.data(), dout_dev.data(), grad_out(dt.data(), false), n, v, c, work.data(), work.numel(),
                         nullptr);
  std::vector<float> want(std::size_t(v * c), 0.f);
  for (std::int64_t i = 0; i < n; ++i)
    if (ids[i] >= 0 && ids[i] < v)
      for (std::int64_t j = 0; j < c; ++j) want[std::size_t(ids[i] * c + j)] += dout[std::size_t(i * c + j)];
  test::check_close("dtable", dt, want, 0);
}

// ---- cross-entropy --------------------------------------------------------------------------

TEMPLATE_TEST_CASE("cross_entropy forward, backward and fused match the CPU twin", "[cuda][tensor]", float, half,
                   bfloat16) {
  using T = TestType;
  const auto [rows, v] = GENERATE(std::pair<std::int64_t, std::int64_t>{7, 13}, std::pair<std::int64_t, std::int64_t>{4, 1024},
                                  std::pair<std::int64_t, std::int64_t>{3, 50304},
                                  std::pair<std::int64_t, std::int64_t>{2, 50257}, std::pair<std::int64_t, std::int64_t>{1, 1});
  const bool accumulate = GENERATE(false, true);
  const bool per_row = GENERATE(false, true);  // dlosses per row, or the scale alone (a mean loss)
  CAPTURE(rows, v, accumulate, per_row);
  const std::size_t n = std::size_t(rows * v);
  const Shape ls{rows, v}, rs{rows};
  const auto logits = test::random_values<T>(n, 30, 5.0), dl0 = test::random_values<T>(n, 31);
  const auto targets = random_ids(std::size_t(rows), std::int32_t(v), 32);
  const auto dlosses = test::random_values<float>(std::size_t(rows), 33);
  const float dloss_scale = per_row ? 0.75f : 1.f / float(rows);

  auto losses = Tensor<float>::empty(rs), lse = Tensor<float>::empty(rs);
  const auto lf = host_tensor(ls, floats(logits));
  cross_entropy_forward(lf, cpu_ids(rs, targets), losses, lse);
  std::vector<float> g(static_cast<std::size_t>(rows));
  for (std::size_t r = 0; r < g.size(); ++r) g[r] = per_row ? dloss_scale * dlosses[r] : dloss_scale;
  auto dl = host_tensor(ls, floats(dl0));
  cross_entropy_backward(lf, cpu_ids(rs, targets), lse, host_tensor(rs, g), GradOut<float>{dl, accumulate});

  const auto logits_dev = test::device_copy(logits), dlosses_dev = test::device_copy(dlosses);
  const auto targets_dev = test::device_copy(targets);
  const float* dlosses_ptr = per_row ? dlosses_dev.data() : nullptr;
  // Losses are near log(V) and agree to a few roundings of lse (the two sums run in different orders).
  auto losses_dev = test::poisoned_device<float>(std::size_t(rows)), lse_dev = test::poisoned_device<float>(std::size_t(rows));
  pc::cross_entropy_forward(logits_dev.data(), targets_dev.data(), losses_dev.data(), lse_dev.data(), rows, v, nullptr);
  test::check_close("losses", losses_dev, losses.to_vector(), 4);
  test::check_close("lse", lse_dev, lse.to_vector(), 4);

  auto dl_dev = accumulate ? test::device_copy(dl0) : test::poisoned_device<T>(n);
  pc::cross_entropy_backward(logits_dev.data(), targets_dev.data(), lse_dev.data(), dlosses_ptr, dloss_scale,
                             grad_out(dl_dev.data(), accumulate), rows, v, nullptr);
  test::check_close("dlogits from lse", dl_dev, dl.to_vector(), 2);

  auto fused_losses = test::poisoned_device<float>(std::size_t(rows));
  auto fused_dl = accumulate ? test::device_copy(dl0) : test::poisoned_device<T>(n);
  pc::cross_entropy_fused(logits_dev.data(), targets_dev.data(), fused_losses.data(), nullptr, dlosses_ptr, dloss_scale,
                          grad_out(fused_dl.data(), accumulate), rows, v, nullptr);
  test::check_close("fused losses", fused_losses, losses.to_vector(), 4);
  test::check_close("fused dlogits", fused_dl, dl.to_vector(), 2);

  if (!accumulate) {  // in place: the gradient overwrites the logits
    auto in_place = test::device_copy(logits);
    auto ip_losses = test::poisoned_device<float>(std::size_t(rows));
    pc::cross_entropy_fused(in_place.data(), targets_dev.data(), ip_losses.data(), nullptr, dlosses_ptr, dloss_scale,
                            grad_out(in_place.data(), false), rows, v, nullptr);
    test::check_close("in-place losses", ip_losses, losses.to_vector(), 4);
    test::check_close("in-place dlogits", in_place, dl.to_vector(), 2);
  }
}

TEMPLATE_TEST_CASE("cross_entropy_rows_fused over more rows than SMs: each block's rows in turn, in place",
                   "[cuda][tensor]", float, half, bfloat16) {
  // The head's path (rows ld apart, the gradient in place of the logits) runs one block an SM,
  // each staging its next row while it works on one: 300 rows are 2 or 3 a block on 132 SMs.
  // v leaves a tail of fewer than a pack; the columns past v must keep the logits' bits.
  using T = TestType;
  const std::int64_t rows = 300, v = 1003, ld = 1008;
  const std::size_t n = std::size_t(rows * ld);
  const auto padded = test::random_values<T>(n, 37, 5.0);
  const auto targets = random_ids(std::size_t(rows), std::int32_t(v), 38);
  const float dloss_scale = 1.f / float(rows);
  std::vector<float> compact(std::size_t(rows * v));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < v; ++j) compact[std::size_t(r * v + j)] = float(padded[std::size_t(r * ld + j)]);
  const Shape ls{rows, v}, rs{rows};
  auto losses = Tensor<float>::empty(rs), lse = Tensor<float>::empty(rs);
  const auto lf = host_tensor(ls, compact);
  cross_entropy_forward(lf, cpu_ids(rs, targets), losses, lse);
  auto dl = Tensor<float>::empty(ls);
  const auto dlosses = host_tensor(rs, std::vector<float>(std::size_t(rows), dloss_scale));
  cross_entropy_backward(lf, cpu_ids(rs, targets), lse, dlosses, GradOut<float>{dl, false});

  auto in_place = test::device_copy(padded);
  const auto targets_dev = test::device_copy(targets);
  auto losses_dev = test::poisoned_device<float>(std::size_t(rows));
  auto lse_dev = test::poisoned_device<float>(std::size_t(rows));
  pc::cross_entropy_rows_fused(in_place.data(), ld, targets_dev.data(), losses_dev.data(), lse_dev.data(), dloss_scale,
                               grad_out(in_place.data(), false), rows, v, nullptr);
  test::check_close("losses", losses_dev, losses.to_vector(), 4);
  test::check_close("lse", lse_dev, lse.to_vector(), 4);
  const auto got = in_place.to_host();
  std::vector<T> grads(std::size_t(rows * v));
  std::size_t padding_changed = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < v; ++j) grads[std::size_t(r * v + j)] = got[std::size_t(r * ld + j)];
    for (std::int64_t j = v; j < ld; ++j)
      padding_changed += std::memcmp(&got[std::size_t(r * ld + j)], &padded[std::size_t(r * ld + j)], sizeof(T)) != 0;
  }
  const auto want = dl.to_vector();
  const double err = test::relative_error(std::span<const T>(grads), std::span<const float>(want));
  INFO("dlogits: relative error " << err);
  CHECK(err <= test::gpu_tolerance<T>() * 2);
  CHECK(padding_changed == 0);
}

TEST_CASE("cross_entropy: a target out of range gives a NaN loss and no onehot term", "[cuda][tensor]") {
  const std::int64_t rows = 3, v = 21;
  const std::vector<std::int32_t> targets = {4, -1, 21};
  const auto logits = test::random_values<float>(std::size_t(rows * v), 34, 3.0);
  const auto logits_dev = test::device_copy(logits);
  const auto targets_dev = test::device_copy(targets);
  auto losses = test::poisoned_device<float>(std::size_t(rows)), lse = test::poisoned_device<float>(std::size_t(rows));
  auto dl = test::poisoned_device<float>(std::size_t(rows * v));
  pc::cross_entropy_fused(logits_dev.data(), targets_dev.data(), losses.data(), lse.data(), nullptr, 1.f,
                          grad_out(dl.data(), false), rows, v, nullptr);
  const auto lh = losses.to_host(), sh = lse.to_host(), dh = dl.to_host();
  CHECK(std::isfinite(lh[0]));
  CHECK(std::isnan(lh[1]));
  CHECK(std::isnan(lh[2]));
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = logits[std::size_t(r * v)], s = 0;
    for (std::int64_t j = 0; j < v; ++j) m = std::max(m, double(logits[std::size_t(r * v + j)]));
    for (std::int64_t j = 0; j < v; ++j) s += std::exp(logits[std::size_t(r * v + j)] - m);
    CHECK(sh[std::size_t(r)] == Approx(m + std::log(s)).epsilon(1e-6));
    for (std::int64_t j = 0; j < v; ++j) {
      const double p = std::exp(logits[std::size_t(r * v + j)] - m) / s;
      CHECK(dh[std::size_t(r * v + j)] == Approx(p - (j == targets[std::size_t(r)] ? 1.0 : 0.0)).margin(1e-6));
    }
  }
}

// ---- column sum -----------------------------------------------------------------------------

TEMPLATE_TEST_CASE("column_sum sums rows in float, deterministically, for any row count", "[cuda][tensor]", float, half,
                   bfloat16) {
  using T = TestType;
  const auto [rows, cols] = GENERATE(std::pair<std::int64_t, std::int64_t>{0, 5}, std::pair<std::int64_t, std::int64_t>{1, 1},
                                     std::pair<std::int64_t, std::int64_t>{7, 13},
                                     std::pair<std::int64_t, std::int64_t>{1000, 37},
                                     std::pair<std::int64_t, std::int64_t>{9000, 24},
                                     std::pair<std::int64_t, std::int64_t>{64, 3072});
  const bool accumulate = GENERATE(false, true);
  CAPTURE(rows, cols, accumulate);
  const auto x = test::random_values<T>(std::size_t(rows * cols), 35), out0 = test::random_values<T>(std::size_t(cols), 36);
  // The reference adds rows one at a time in float, as the CPU bias gradient does.
  std::vector<float> want = accumulate ? floats(out0) : std::vector<float>(std::size_t(cols), 0.f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) want[std::size_t(c)] += static_cast<float>(x[std::size_t(r * cols + c)]);

  const auto x_dev = test::device_copy(rows > 0 ? x : std::vector<T>(1, T(0.f)));
  auto work = test::poisoned_device<float>(std::max<std::size_t>(1, pc::column_sum_workspace_floats(rows, cols)));
  auto run = [&] {
    auto out = accumulate ? test::device_copy(out0) : test::poisoned_device<T>(std::size_t(cols));
    pc::column_sum(x_dev.data(), grad_out(out.data(), accumulate), rows, cols, work.data(), work.numel(), nullptr);
    return out.to_host();
  };
  const auto got = run(), again = run();
  // Different reduction orders (rows one by one against chunks): about sqrt(rows) roundings.
  check_host("column_sum", got, want, 8);
  CHECK(std::memcmp(got.data(), again.data(), got.size() * sizeof(T)) == 0);
}
