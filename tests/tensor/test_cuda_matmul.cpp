// cuda::matmul (cuBLASLt) against the CPU matmul: every transpose, odd shapes, padded leading
// dimensions, strided batches, beta, and each epilogue, in fp32 (and TF32), fp16 and bf16.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "polyshard/tensor/cuda/matmul.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/transfer.hpp"
#include "polyshard/tensor/ops.hpp"
#include "support/gpu_compare.hpp"

using namespace polyshard;

namespace {

/// Bound on the relative error of a product whose inputs were rounded to T before both sides
/// saw them: what is left is the order of the fp32 sums and the rounding of the output to T.
/// fp32: 1e-5, growing with sqrt(k) past k = 256. TF32 keeps 10 of fp32's 23 mantissa bits and
/// Hopper's tensor cores may truncate rather than round them, which costs up to 2^-10 per
/// product, hence 3e-3. fp16 and bf16: about one rounding of the output (2^-11, 2^-8).
template <class T>
double product_bound(std::int64_t k, bool tf32 = false) {
  if constexpr (std::is_same_v<T, float>)
    return tf32 ? 3e-3 : 1e-5 * std::max(1.0, std::sqrt(static_cast<double>(k) / 256.0));
  else if constexpr (std::is_same_v<T, polyshard::half>)
    return 2e-3;
  else
    return 1e-2;
}

/// The GELU epilogues may evaluate tanh with the hardware approximation (about 2^-11 absolute),
/// which the derivative amplifies up to three times: allowed on top of the product's bound.
template <class T>
double gelu_bound(std::int64_t k) {
  return product_bound<T>(k) + 3e-3;
}

template <class T>
T nan_value() {
  return T(std::numeric_limits<float>::quiet_NaN());
}

/// A matrix as the device stores it: `batch` items `stride` elements apart, each (rows, cols)
/// row-major with row stride ld. Padding holds NaN, so a kernel that reads it poisons its
/// result, and one that writes it is caught by padding_untouched().
template <class T>
struct Stored {
  std::int64_t batch, rows, cols, ld, stride;
  std::vector<T> host;

  Stored(std::int64_t batch_, std::int64_t rows_, std::int64_t cols_, std::int64_t pad = 0, std::int64_t gap = 0)
      : batch(batch_),
        rows(rows_),
        cols(cols_),
        ld(cols_ + pad),
        stride(rows_ * (cols_ + pad) + gap),
        host(static_cast<std::size_t>(batch_ * stride), nan_value<T>()) {}

  std::size_t index(std::int64_t b, std::int64_t r, std::int64_t c) const {
    return static_cast<std::size_t>(b * stride + r * ld + c);
  }
  /// Uniform values in [-scale, scale), rounded to T.
  Stored& fill_random(std::uint64_t seed, double scale = 1.0) {
    const auto v = test::random_values<T>(static_cast<std::size_t>(batch * rows * cols), seed, scale);
    std::size_t i = 0;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) host[index(b, r, c)] = v[i++];
    return *this;
  }
  /// The values as fp32: (batch, rows, cols), or (batch, cols, rows) when `transposed`.
  Tensor<float> values(bool transposed = false) const {
    auto t = Tensor<float>::empty(transposed ? Shape{batch, cols, rows} : Shape{batch, rows, cols});
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) {
          const std::int64_t to = transposed ? (b * cols + c) * rows + r : (b * rows + r) * cols + c;
          t.data()[to] = static_cast<float>(host[index(b, r, c)]);
        }
    return t;
  }
  /// This layout holding `device`'s elements (a copy read back from the GPU).
  Stored with(std::vector<T> device) const {
    Stored s = *this;
    s.host = std::move(device);
    return s;
  }
  /// Whether every element outside the (rows, cols) items is still NaN.
  bool padding_untouched() const {
    for (std::size_t i = 0; i < host.size(); ++i) {
      const std::int64_t within = static_cast<std::int64_t>(i) % stride;
      const bool inside = within / ld < rows && within % ld < cols;
      if (!inside && !std::isnan(static_cast<float>(host[i]))) return false;
    }
    return true;
  }
};

double error_of(const Tensor<float>& got, const Tensor<float>& want) {
  return test::relative_error(std::span<const float>(got.data(), static_cast<std::size_t>(got.numel())),
                              std::span<const float>(want.data(), static_cast<std::size_t>(want.numel())));
}

std::vector<float> to_floats(const Tensor<float>& t) { return std::vector<float>(t.data(), t.data() + t.numel()); }

template <class T>
std::vector<float> to_floats(const std::vector<T>& v) {
  std::vector<float> out;
  for (const T& x : v) out.push_back(static_cast<float>(x));
  return out;
}

double error_of(const std::vector<float>& got, const std::vector<float>& want) {
  return test::relative_error(std::span<const float>(got), std::span<const float>(want));
}

/// One product: shapes, layouts and scalars.
struct Case {
  std::int64_t m, n, k;
  bool trans_a = false, trans_b = false;
  std::int64_t pad = 0;  // extra elements per stored row of A, B and C
  std::int64_t batch = 1;
  std::int64_t gap = 0;   // extra elements between batch items
  bool shared_b = false;  // one B for the whole batch (stride 0)
  float alpha = 1.0f, beta = 0.0f;
  bool tf32 = false;
};

std::string describe(const Case& c) {
  return "C(" + std::to_string(c.m) + ", " + std::to_string(c.n) + ") k = " + std::to_string(c.k) +
         (c.trans_a ? " A^T" : " A") + (c.trans_b ? " B^T" : " B") + " pad " + std::to_string(c.pad) + " batch " +
         std::to_string(c.batch) + (c.shared_b ? " (shared B)" : "") + " gap " + std::to_string(c.gap) + " alpha " +
         std::to_string(c.alpha) + " beta " + std::to_string(c.beta) + (c.tf32 ? " tf32" : "");
}

/// The device-side operands of a Case, filled with random values, and the arguments naming them.
template <class T>
struct Problem {
  Case c;
  Stored<T> a, b, out;
  cuda::DeviceBuffer<T> da, db, dc;

  explicit Problem(const Case& c_)
      : c(c_),
        a(c_.batch, c_.trans_a ? c_.k : c_.m, c_.trans_a ? c_.m : c_.k, c_.pad, c_.gap),
        b(c_.shared_b ? 1 : c_.batch, c_.trans_b ? c_.n : c_.k, c_.trans_b ? c_.k : c_.n, c_.pad, c_.gap),
        out(c_.batch, c_.m, c_.n, c_.pad, c_.gap) {
    a.fill_random(11);
    b.fill_random(12);
    if (c.beta != 0.0f) out.fill_random(13);  // else all NaN: C must be overwritten, never read
    da = test::device_copy(a.host);
    db = test::device_copy(b.host);
    dc = test::device_copy(out.host);
  }

  cuda::MatmulArgs<T> args() const {
    cuda::MatmulArgs<T> r;
    r.m = c.m;
    r.n = c.n;
    r.k = c.k;
    r.a = da.data();
    r.lda = a.ld;
    r.trans_a = c.trans_a;
    r.b = db.data();
    r.ldb = b.ld;
    r.trans_b = c.trans_b;
    r.c = dc.data();
    r.ldc = out.ld;
    r.alpha = c.alpha;
    r.beta = c.beta;
    r.batch_count = c.batch;
    r.stride_a = a.stride;
    r.stride_b = c.shared_b ? 0 : b.stride;
    r.stride_c = out.stride;
    r.allow_tf32 = c.tf32;
    return r;
  }

  /// The CPU twin of the product, before any epilogue: (batch, m, n).
  Tensor<float> cpu_product() const {
    Tensor<float> want = c.beta != 0.0f ? out.values() : Tensor<float>::zeros({c.batch, c.m, c.n});
    Tensor<float> bv = b.values(c.trans_b);
    if (c.shared_b) bv = bv.reshape({c.k, c.n});
    matmul_into(a.values(c.trans_a), bv, want, c.alpha, c.beta);
    return want;
  }

  /// C as the GPU left it, in the layout it was given.
  Stored<T> result() const { return out.with(dc.to_host()); }
};

/// Runs a plain product and checks it against the CPU twin and the padding of C.
template <class T>
void check_product(const Case& c) {
  INFO(describe(c));
  Problem<T> p(c);
  cuda::matmul(p.args(), nullptr);
  const Stored<T> got = p.result();
  const double err = error_of(got.values(), p.cpu_product());
  const double bound = product_bound<T>(c.k, c.tf32);
  INFO("relative error " << err << " (bound " << bound << ")");
  CHECK(err <= bound);
  CHECK(got.padding_untouched());
}

/// The bias-gradient twin: the sums of `t` (batch 1, rows, cols) over its rows, one per column.
std::vector<float> sum_over_rows(const Tensor<float>& t) {
  const std::int64_t rows = t.size(-2), cols = t.size(-1);
  std::vector<float> s(static_cast<std::size_t>(cols));
  for (std::int64_t j = 0; j < cols; ++j) {
    double acc = 0;
    for (std::int64_t i = 0; i < rows; ++i) acc += t.data()[i * cols + j];
    s[static_cast<std::size_t>(j)] = static_cast<float>(acc);
  }
  return s;
}
/// Adds bias[j] to every element (.., i, j).
void add_bias(Tensor<float>& t, const std::vector<float>& bias) {
  const std::int64_t n = t.size(-1);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] += bias[static_cast<std::size_t>(i % n)];
}

Tensor<float> gelu_of(const Tensor<float>& x) {
  auto y = Tensor<float>::empty(x.shape());
  gelu_forward(x, y);
  return y;
}

/// The element types cuda::matmul takes; each test below runs once per type.
using ElementTypes = std::tuple<float, polyshard::half, polyshard::bfloat16>;

}  // namespace

TEMPLATE_LIST_TEST_CASE("cuda::matmul matches the CPU product for every transpose, shape and leading dimension",
                        "[cuda][tensor]", ElementTypes) {
  const auto [m, n, k] = GENERATE(std::tuple<std::int64_t, std::int64_t, std::int64_t>{64, 48, 40},
                                  std::tuple<std::int64_t, std::int64_t, std::int64_t>{7, 13, 5},
                                  std::tuple<std::int64_t, std::int64_t, std::int64_t>{130, 67, 300});
  const bool trans_a = GENERATE(false, true);
  const bool trans_b = GENERATE(false, true);
  // 16-bit rows of odd length leave the 16-byte alignment tensor-core kernels prefer: cuBLASLt
  // still multiplies them (more slowly), and polyshard does not refuse them.
  const std::int64_t pad = GENERATE(0, 3);
  check_product<TestType>({.m = m, .n = n, .k = k, .trans_a = trans_a, .trans_b = trans_b, .pad = pad});
}

TEMPLATE_LIST_TEST_CASE("cuda::matmul multiplies strided batches, with B per item or shared", "[cuda][tensor]",
                        ElementTypes) {
  const auto [m, n, k] = GENERATE(std::tuple<std::int64_t, std::int64_t, std::int64_t>{32, 24, 16},
                                  std::tuple<std::int64_t, std::int64_t, std::int64_t>{7, 13, 5});
  const bool trans_a = GENERATE(false, true);
  const bool trans_b = GENERATE(false, true);
  const bool shared_b = GENERATE(false, true);
  check_product<TestType>(
      {.m = m, .n = n, .k = k, .trans_a = trans_a, .trans_b = trans_b, .batch = 3, .gap = 8, .shared_b = shared_b});
}

TEMPLATE_LIST_TEST_CASE("cuda::matmul scales by alpha and accumulates beta C", "[cuda][tensor]", ElementTypes) {
  const auto [alpha, beta] = GENERATE(std::pair{1.5f, 0.5f}, std::pair{1.0f, 1.0f}, std::pair{-0.5f, 2.0f});
  const bool trans_a = GENERATE(false, true);
  const std::int64_t batch = GENERATE(1, 2);
  check_product<TestType>(
      {.m = 64, .n = 48, .k = 40, .trans_a = trans_a, .batch = batch, .alpha = alpha, .beta = beta});
  check_product<TestType>({.m = 7, .n = 13, .k = 5, .trans_b = true, .pad = 2, .alpha = alpha, .beta = beta});
}

TEST_CASE("cuda::matmul with TF32 allowed stays within TF32's precision", "[cuda][tensor]") {
  const bool trans_b = GENERATE(false, true);
  check_product<float>({.m = 64, .n = 48, .k = 40, .trans_b = trans_b, .tf32 = true});
  check_product<float>({.m = 130, .n = 67, .k = 300, .trans_b = trans_b, .tf32 = true});
  check_product<float>({.m = 32, .n = 24, .k = 16, .batch = 3, .gap = 8, .tf32 = true});
}

TEMPLATE_LIST_TEST_CASE("the bias epilogue adds one bias per column, broadcast over the rows", "[cuda][tensor]",
                        ElementTypes) {
  const bool trans_a = GENERATE(false, true);
  const bool trans_b = GENERATE(false, true);
  const std::int64_t batch = GENERATE(1, 3);
  const Case c{.m = 64, .n = 48, .k = 40, .trans_a = trans_a, .trans_b = trans_b, .batch = batch};
  INFO(describe(c));
  Problem<TestType> p(c);
  const auto bias1 = test::random_values<TestType>(static_cast<std::size_t>(c.n), 21);
  const auto bias2 = test::random_values<TestType>(static_cast<std::size_t>(c.n), 22);
  auto d_bias1 = test::device_copy(bias1), d_bias2 = test::device_copy(bias2);

  auto args = p.args();
  args.epilogue = cuda::Epilogue::Bias;
  args.bias = d_bias1.data();
  cuda::matmul(args, nullptr);
  Tensor<float> want = p.cpu_product();
  add_bias(want, to_floats(bias1));
  const double err = error_of(p.result().values(), want);
  INFO("first bias: relative error " << err);
  CHECK(err <= product_bound<TestType>(c.k));
  CHECK(p.result().padding_untouched());

  // The same problem again with another bias: the cached plan must take the new pointer.
  const std::size_t plans = cuda::CublasLt::current().cached_plans();
  p.dc.fill_bytes(0xFF);
  args.bias = d_bias2.data();
  cuda::matmul(args, nullptr);
  CHECK(cuda::CublasLt::current().cached_plans() == plans);
  want = p.cpu_product();
  add_bias(want, to_floats(bias2));
  const double err2 = error_of(p.result().values(), want);
  INFO("second bias: relative error " << err2);
  CHECK(err2 <= product_bound<TestType>(c.k));
}

TEMPLATE_LIST_TEST_CASE("the bias+GELU epilogues apply GPT-2's GELU and save its input in aux", "[cuda][tensor]",
                        ElementTypes) {
  // A linear layer's layout, X (m, k) times W^T with W stored (n, k), and W stored (k, n).
  const bool trans_b = GENERATE(true, false);
  const bool save_aux = GENERATE(false, true);
  const Case c{.m = 64, .n = 48, .k = 40, .trans_b = trans_b};
  INFO(describe(c) << (save_aux ? " with aux" : ""));
  Problem<TestType> p(c);
  const auto bias = test::random_values<TestType>(static_cast<std::size_t>(c.n), 31);
  auto d_bias = test::device_copy(bias);
  Stored<TestType> aux(1, c.m, c.n, /*pad=*/8);  // aux_ld = 56: >= n and divisible by 8
  auto d_aux = test::device_copy(aux.host);

  auto args = p.args();
  args.epilogue = save_aux ? cuda::Epilogue::BiasGeluAux : cuda::Epilogue::BiasGelu;
  args.bias = d_bias.data();
  if (save_aux) {
    args.aux = d_aux.data();
    args.aux_ld = aux.ld;
  }
  cuda::matmul(args, nullptr);

  Tensor<float> pre = p.cpu_product();
  add_bias(pre, to_floats(bias));
  const double err = error_of(p.result().values(), gelu_of(pre));
  INFO("output: relative error " << err);
  CHECK(err <= gelu_bound<TestType>(c.k));
  CHECK(p.result().padding_untouched());
  if (save_aux) {
    const Stored<TestType> got_aux = aux.with(d_aux.to_host());
    const double aux_err = error_of(got_aux.values(), pre);
    INFO("aux (the GELU input): relative error " << aux_err);
    CHECK(aux_err <= product_bound<TestType>(c.k));
    CHECK(got_aux.padding_untouched());
  }
}

TEMPLATE_LIST_TEST_CASE("the dGELU epilogues multiply the product by gelu'(aux) and can sum it into a bias gradient",
                        "[cuda][tensor]", ElementTypes) {
  // An MLP's backward: d(pre) = (dY W) * gelu'(pre), dY (m, k), W stored (k, n); the bias
  // gradient of the layer before the GELU is the sum of d(pre) over the rows.
  const bool with_bias_grad = GENERATE(false, true);
  const Case c{.m = 64, .n = 48, .k = 40};
  INFO(describe(c) << (with_bias_grad ? " with the bias gradient" : ""));
  Problem<TestType> p(c);
  Stored<TestType> aux(1, c.m, c.n, /*pad=*/8);
  aux.fill_random(41, 3.0);  // pre-activations across GELU's bend
  auto d_aux = test::device_copy(aux.host);
  auto d_bias_grad = test::poisoned_device<TestType>(static_cast<std::size_t>(c.n));

  auto args = p.args();
  args.epilogue = with_bias_grad ? cuda::Epilogue::DGeluBiasGrad : cuda::Epilogue::DGelu;
  args.aux = d_aux.data();
  args.aux_ld = aux.ld;
  if (with_bias_grad) args.bias_grad = d_bias_grad.data();
  cuda::matmul(args, nullptr);

  const Tensor<float> product = p.cpu_product();
  auto want = Tensor<float>::empty(product.shape());
  gelu_backward(aux.values(), product, GradOut<float>{want, false});
  const double err = error_of(p.result().values(), want);
  INFO("output: relative error " << err);
  CHECK(err <= gelu_bound<TestType>(c.k));
  CHECK(p.result().padding_untouched());
  if (with_bias_grad) {
    const double bias_err = error_of(to_floats(d_bias_grad.to_host()), sum_over_rows(want));
    INFO("bias gradient: relative error " << bias_err);
    CHECK(bias_err <= gelu_bound<TestType>(c.k));
  }
}

TEMPLATE_LIST_TEST_CASE("BiasGradA gives a linear layer's bias gradient beside its weight gradient", "[cuda][tensor]",
                        ElementTypes) {
  // Y (N, out) = X (N, in) W^T + b. dW (out, in) = dY^T X: A = dY stored (N, out) and
  // transposed, B = X stored (N, in), k = N; db = the sum of dY over its N rows = the row sums
  // of op(A).
  const std::int64_t tokens = 64, out = 48, in = 40;
  const float beta = GENERATE(0.0f, 1.0f);  // 1: a weight gradient accumulated over micro-batches
  const Case c{.m = out, .n = in, .k = tokens, .trans_a = true, .beta = beta};
  INFO(describe(c));
  Problem<TestType> p(c);
  auto d_bias_grad = test::poisoned_device<TestType>(static_cast<std::size_t>(out));
  auto args = p.args();
  args.epilogue = cuda::Epilogue::BiasGradA;
  args.bias_grad = d_bias_grad.data();
  cuda::matmul(args, nullptr);

  const double err = error_of(p.result().values(), p.cpu_product());
  INFO("weight gradient: relative error " << err);
  CHECK(err <= product_bound<TestType>(c.k));
  const Tensor<float> dy = p.a.values();  // stored (N, out)
  const double bias_err = error_of(to_floats(d_bias_grad.to_host()), sum_over_rows(dy));
  INFO("bias gradient: relative error " << bias_err);
  CHECK(bias_err <= product_bound<TestType>(c.k));
}

TEMPLATE_LIST_TEST_CASE("BiasGradB sums op(B) over k", "[cuda][tensor]", ElementTypes) {
  // dW^T (in, out) = X^T dY: A = X stored (N, in) and transposed, B = dY stored (N, out);
  // db = the column sums of op(B) = dY's sums over its N rows.
  const std::int64_t tokens = 64, out = 48, in = 40;
  const Case c{.m = in, .n = out, .k = tokens, .trans_a = true};
  INFO(describe(c));
  Problem<TestType> p(c);
  auto d_bias_grad = test::poisoned_device<TestType>(static_cast<std::size_t>(out));
  auto args = p.args();
  args.epilogue = cuda::Epilogue::BiasGradB;
  args.bias_grad = d_bias_grad.data();
  cuda::matmul(args, nullptr);
  const double err = error_of(p.result().values(), p.cpu_product());
  INFO("product: relative error " << err);
  CHECK(err <= product_bound<TestType>(c.k));
  const double bias_err = error_of(to_floats(d_bias_grad.to_host()), sum_over_rows(p.b.values()));
  INFO("bias gradient: relative error " << bias_err);
  CHECK(bias_err <= product_bound<TestType>(c.k));
}

TEST_CASE("a repeated problem reuses its plan, another pointer alignment gets its own", "[cuda][tensor]") {
  const Case c{.m = 64, .n = 48, .k = 40, .trans_b = true};
  Problem<float> p1(c), p2(c);
  auto& lt = cuda::CublasLt::current();
  cuda::matmul(p1.args(), nullptr);
  const std::size_t plans = lt.cached_plans();
  cuda::matmul(p2.args(), nullptr);  // other buffers; the pool hands out equally aligned ones
  const auto same_alignment = [](const void* x, const void* y) {
    return cuda::detail::alignment_of(x) == cuda::detail::alignment_of(y);
  };
  if (same_alignment(p1.da.data(), p2.da.data()) && same_alignment(p1.db.data(), p2.db.data()) &&
      same_alignment(p1.dc.data(), p2.dc.data()))
    CHECK(lt.cached_plans() == plans);
  CHECK(error_of(p2.result().values(), p2.cpu_product()) <= product_bound<float>(c.k));

  // C one element into a larger buffer: 4-byte alignment, a new plan, still the right product.
  const std::size_t before_shift = lt.cached_plans();
  const std::vector<float> host(static_cast<std::size_t>(c.m * c.n + 1), std::numeric_limits<float>::quiet_NaN());
  auto shifted = test::device_copy(host);
  auto args = p1.args();
  args.c = shifted.data() + 1;
  cuda::matmul(args, nullptr);
  CHECK(lt.cached_plans() == before_shift + 1);
  const auto got = shifted.to_host();
  const std::vector<float> got_c(got.begin() + 1, got.end());
  CHECK(error_of(got_c, to_floats(p1.cpu_product())) <= product_bound<float>(c.k));
  CHECK(std::isnan(got[0]));
}

TEST_CASE("a stream that takes a destroyed stream's handle gets a cuBLASLt workspace of its own", "[cuda][tensor]") {
  // A destroyed stream's handle can come back for the next stream created (the emulated device
  // always gives it back at once), while the old stream's products may still run in the
  // workspace kept for that handle: the workspace follows the stream's id, not its handle.
  const Case c{.m = 64, .n = 48, .k = 40};
  Problem<float> p(c);
  auto& lt = cuda::CublasLt::current();
  cudaStream_t first = nullptr, second = nullptr;
  unsigned long long first_id = 0, second_id = 0;
  REQUIRE(cudaStreamCreate(&first) == cudaSuccess);
  REQUIRE(cudaStreamGetId(first, &first_id) == cudaSuccess);
  cuda::matmul(p.args(), first);
  CHECK(lt.workspace_stream_id(first) == first_id);
  REQUIRE(cudaStreamDestroy(first) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&second) == cudaSuccess);
  REQUIRE(cudaStreamGetId(second, &second_id) == cudaSuccess);
  CHECK(second_id != first_id);
#if defined(POLYSHARD_CUDA_EMULATION)
  REQUIRE(second == first);
#endif
  cuda::matmul(p.args(), second);
  CHECK(lt.workspace_stream_id(second) == second_id);
  REQUIRE(cudaStreamSynchronize(second) == cudaSuccess);
  CHECK(error_of(p.result().values(), p.cpu_product()) <= product_bound<float>(c.k));
  REQUIRE(cudaStreamDestroy(second) == cudaSuccess);
}

TEST_CASE("matmul_into on device tensors with k = 0 gives beta C, zeros for beta = 0 even over NaN",
          "[cuda][tensor]") {
  const auto a = Tensor<float, Cuda>::empty(Shape{2, 4, 0}), b = Tensor<float, Cuda>::empty(Shape{0, 3});
  const auto c = Tensor<float, Cuda>::empty(Shape{2, 4, 3});
  c.fill(std::numeric_limits<float>::quiet_NaN());
  matmul_into(a, b, c);
  for (const float x : c.to_vector()) CHECK(x == 0.0f);
  c.fill(2.0f);
  matmul_into(a, b, c, 1.0f, 0.5f);
  for (const float x : c.to_vector()) CHECK(x == 1.0f);
}

TEST_CASE("cuda::matmul writes every element of an output nothing wrote before", "[cuda][tensor][fresh-output]") {
  // The product's output is taken from the memory pool and never written before cuBLASLt's
  // kernel: every element equal to the CPU product (random inputs, so none is zero by chance)
  // shows that the kernel wrote all of them. Run alone in a process (a fresh pool) under
  // compute-sanitizer's initcheck, this case tells whether initcheck sees the stores of the
  // kernels cuBLASLt picks on the GPU (on Hopper, through the tensor memory accelerator): a
  // report of an uninitialized read of the output, when copied back here, would be initcheck's
  // (benchmarks/gpu/packed.sh runs it so).
  const std::int64_t m = 256, n = 384, k = 128;
  const auto a_host = test::random_values<bfloat16>(std::size_t(m * k), 41);
  const auto b_host = test::random_values<bfloat16>(std::size_t(k * n), 42);
  const auto a = Tensor<bfloat16>::from({m, k}, std::span<const bfloat16>(a_host));
  const auto b = Tensor<bfloat16>::from({k, n}, std::span<const bfloat16>(b_host));
  const Tensor<bfloat16> got = to_host(matmul(to_device(a), to_device(b)));
  const std::vector<float> a_float(a_host.begin(), a_host.end()), b_float(b_host.begin(), b_host.end());
  const Tensor<float> want = matmul(Tensor<float>::from({m, k}, std::span<const float>(a_float)),
                                    Tensor<float>::from({k, n}, std::span<const float>(b_float)));
  std::size_t wrong = 0, zero = 0;
  for (std::int64_t i = 0; i < m * n; ++i) {
    const double g = static_cast<float>(got.data()[i]), w = want.data()[i];
    if (!(std::abs(g - w) <= 1e-2 * std::max(1.0, std::abs(w)))) ++wrong;
    if (w == 0.0) ++zero;
  }
  CHECK(zero == 0);
  CHECK(wrong == 0);
}

TEST_CASE("clearing a product's outputs zeros what it writes and nothing else", "[cuda][tensor]") {
  // What POLYSHARD_CLEAR_PRODUCT_OUTPUTS=1 does before each product (for compute-sanitizer's
  // initcheck): C's elements where beta is 0, aux and the bias gradient; the gaps between rows
  // and between batch items keep their NaN, as does C where beta reads it.
  const std::int64_t m = 5, n = 7;
  Stored<float> c(2, m, n, 3, 4);
  auto dc = test::device_copy(c.host);
  Stored<float> aux(1, m, n, 1);  // aux_ld 8
  auto daux = test::device_copy(aux.host);
  std::vector<float> bias_grad(n + 2, nan_value<float>());
  auto dgrad = test::device_copy(bias_grad);
  cuda::MatmulArgs<float> args{.m = m, .n = n, .k = 3, .c = dc.data(), .ldc = c.ld, .batch_count = 2,
                               .stride_c = c.stride, .epilogue = cuda::Epilogue::BiasGeluAux, .aux = daux.data(),
                               .aux_ld = aux.ld};
  cuda::detail::clear_outputs(args, cuda::current_stream());
  const auto zero_inside = [](const Stored<float>& s) {
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t r = 0; r < s.rows; ++r)
        for (std::int64_t i = 0; i < s.cols; ++i)
          if (s.host[s.index(b, r, i)] != 0.0f) return false;
    return true;
  };
  const Stored<float> c_after = c.with(dc.to_host()), aux_after = aux.with(daux.to_host());
  CHECK(zero_inside(c_after));
  CHECK(c_after.padding_untouched());
  CHECK(zero_inside(aux_after));
  CHECK(aux_after.padding_untouched());

  // The bias gradient (n of them for BiasGradB), and C left as it is when beta reads it.
  auto dc2 = test::device_copy(c.host);
  args = {.m = m, .n = n, .k = 3, .c = dc2.data(), .ldc = c.ld, .beta = 1.0f, .batch_count = 2,
          .stride_c = c.stride, .epilogue = cuda::Epilogue::BiasGradB, .bias_grad = dgrad.data()};
  cuda::detail::clear_outputs(args, cuda::current_stream());
  const std::vector<float> grad_after = dgrad.to_host();
  CHECK(std::all_of(grad_after.begin(), grad_after.begin() + n, [](float x) { return x == 0.0f; }));
  CHECK(std::all_of(grad_after.begin() + n, grad_after.end(), [](float x) { return std::isnan(x); }));
  const std::vector<float> c_read = dc2.to_host();
  CHECK(std::all_of(c_read.begin(), c_read.end(), [](float x) { return std::isnan(x); }));
}
