// The emulated cuBLASLt against products written out on the host: a product by hand, every
// transpose with padded leading dimensions, alpha and beta, in place, strided batches, fp32, fp16
// and bf16, each epilogue in the direction cuBLASLt documents, and the calls it must refuse.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "polyshard/emulation/runtime.hpp"

namespace {

// ---------------------------------------------------------------------------------------------
// Element types: cuBLASLt's name, host conversions, and the bound on the relative error of one
// rounding of the output (the reference is the same sum in double from the same rounded inputs).
// ---------------------------------------------------------------------------------------------
template <class T>
struct Type;
template <>
struct Type<float> {
  static constexpr cudaDataType_t id = CUDA_R_32F;
  static constexpr double bound = 1e-6;
  static float from(double v) { return static_cast<float>(v); }
  static double to(float v) { return v; }
};
template <>
struct Type<__half> {
  static constexpr cudaDataType_t id = CUDA_R_16F;
  static constexpr double bound = 1e-3;  // 2^-11 relative, with room for the sum's order
  static __half from(double v) { return __double2half(v); }
  static double to(__half v) { return __half2float(v); }
};
template <>
struct Type<__nv_bfloat16> {
  static constexpr cudaDataType_t id = CUDA_R_16BF;
  static constexpr double bound = 8e-3;  // 2^-8 relative
  static __nv_bfloat16 from(double v) { return __double2bfloat16(v); }
  static double to(__nv_bfloat16 v) { return __bfloat162float(v); }
};

constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();

/// |got - want| relative to 1 + |want| (so that values near 0 are held to an absolute bound).
double error(double got, double want) { return std::abs(got - want) / (1.0 + std::abs(want)); }

// GELU's tanh form, written from its definition (as in GPT-2), and its derivative.
double gelu(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double gelu_grad(double x) {
  const double s = std::sqrt(2.0 / M_PI), t = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// ---------------------------------------------------------------------------------------------
// Matrices as cuBLASLt stores them: column-major, element (i, j) of item b at
// b * stride + i + j * ld. Everything that is not an element holds NaN, so that a product that
// reads padding poisons its result and one that writes it is caught by padding_untouched().
// ---------------------------------------------------------------------------------------------
struct MatrixSpec {
  cudaDataType_t type = CUDA_R_32F;
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
  std::int32_t batch = 1;
  std::int64_t stride = 0;
  std::int32_t order = CUBLASLT_ORDER_COL;
};

template <class T>
struct Host {
  std::int64_t rows, cols, ld, batch, stride;
  std::vector<T> v;

  Host(std::int64_t rows_, std::int64_t cols_, std::int64_t pad = 0, std::int64_t batch_ = 1, std::int64_t gap = 0)
      : rows(rows_),
        cols(cols_),
        ld(rows_ + pad),
        batch(batch_),
        stride(ld * cols_ + gap),
        v(static_cast<std::size_t>((batch_ - 1) * stride + ld * cols_), Type<T>::from(not_a_number)) {}

  std::size_t index(std::int64_t b, std::int64_t i, std::int64_t j) const {
    return static_cast<std::size_t>(b * stride + i + j * ld);
  }
  double operator()(std::int64_t i, std::int64_t j, std::int64_t b = 0) const { return Type<T>::to(v[index(b, i, j)]); }
  void set(std::int64_t i, std::int64_t j, double x, std::int64_t b = 0) { v[index(b, i, j)] = Type<T>::from(x); }

  Host& random(unsigned seed, double scale = 1.0) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<double> u(-scale, scale);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t j = 0; j < cols; ++j)
        for (std::int64_t i = 0; i < rows; ++i) set(i, j, u(gen), b);
    return *this;
  }
  bool padding_untouched() const {
    for (std::size_t x = 0; x < v.size(); ++x) {
      const std::int64_t within = static_cast<std::int64_t>(x) % stride;
      const bool element = within < ld * cols && within % ld < rows;
      if (!element && !std::isnan(Type<T>::to(v[x]))) return false;
    }
    return true;
  }
  MatrixSpec spec() const {
    return {Type<T>::id, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols),
            ld,          static_cast<std::int32_t>(batch), batch > 1 ? stride : 0};
  }
};

/// A device allocation of the current device.
struct Device {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit Device(std::size_t bytes_) : bytes(bytes_) { REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess); }
  template <class T>
  explicit Device(const std::vector<T>& host) : Device(host.size() * sizeof(T)) {
    REQUIRE(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  template <class T>
  std::vector<T> back() const {
    std::vector<T> host(bytes / sizeof(T));
    REQUIRE(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
  template <class T>
  Host<T> back(Host<T> layout) const {
    layout.v = back<T>();
    return layout;
  }
};

// ---------------------------------------------------------------------------------------------
// One call as a program makes it: descriptors, heuristic, matmul, then the descriptors destroyed
// at once (before the stream is synchronised: the emulation must have captured their values).
// ---------------------------------------------------------------------------------------------
struct Spec {
  MatrixSpec a, b, c, d;
  std::int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  std::uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // the bias, or where the bias gradient goes
  void* aux = nullptr;
  std::int64_t aux_ld = 0, bias_stride = 0;
  float alpha = 1.0f, beta = 0.0f;
  std::int32_t compute = CUBLAS_COMPUTE_32F, pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  const void* a_scale = nullptr;
  std::uint32_t promised_align_a = 0;  // 0: A's own alignment, as polyshard's matmul promises
  cudaStream_t stream = nullptr;
};

struct Outcome {
  cublasStatus_t heuristic;
  int algos;
  std::size_t workspace;
  cublasStatus_t matmul;
};

std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 1;
  while (a < 256 && (address & a) == 0) a <<= 1;
  return a;
}

/// What polyshard's matmul promises the heuristic: the pointer's alignment, lowered to what every
/// batch item keeps.
std::uint32_t promise(const void* p, const MatrixSpec& m) {
  std::uint32_t a = alignment_of(p);
  const std::uint64_t step = static_cast<std::uint64_t>(m.stride) * (m.type == CUDA_R_32F ? 4 : 2);
  while (m.batch > 1 && a > 1 && step % a != 0) a >>= 1;
  return a;
}

template <class V>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS);
}

cublasLtMatrixLayout_t make_layout(const MatrixSpec& m) {
  cublasLtMatrixLayout_t l = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&l, m.type, m.rows, m.cols, m.ld) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &m.order, sizeof(m.order)) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &m.batch, sizeof(m.batch)) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.stride,
                                           sizeof(m.stride)) == CUBLAS_STATUS_SUCCESS);
  return l;
}

Outcome multiply(const Spec& s, const void* A, const void* B, const void* C, void* D) {
  cublasLtHandle_t handle = nullptr;
  REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&desc, static_cast<cublasComputeType_t>(s.compute), CUDA_R_32F) ==
          CUBLAS_STATUS_SUCCESS);
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, s.transa);
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, s.transb);
  set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, s.epilogue);
  if (s.pointer_mode != CUBLASLT_POINTER_MODE_HOST) set_desc(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, s.pointer_mode);
  if (s.bias) set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, s.bias);
  if (s.bias_stride) set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, s.bias_stride);
  if (s.aux) set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, s.aux);
  if (s.aux_ld) set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, s.aux_ld);
  if (s.a_scale) set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, s.a_scale);
  cublasLtMatrixLayout_t la = make_layout(s.a), lb = make_layout(s.b), lc = make_layout(s.c), ld = make_layout(s.d);

  cublasLtMatmulPreference_t pref = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  const std::uint64_t workspace_bytes = 1 << 20;
  REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                               sizeof(workspace_bytes)) == CUBLAS_STATUS_SUCCESS);
  const std::uint32_t aligns[] = {s.promised_align_a ? s.promised_align_a : promise(A, s.a), promise(B, s.b),
                                  promise(C, s.c), promise(D, s.d)};
  const cublasLtMatmulPreferenceAttributes_t align_attrs[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &aligns[i], sizeof(aligns[i])) ==
            CUBLAS_STATUS_SUCCESS);

  Outcome out{};
  cublasLtMatmulHeuristicResult_t result{};
  out.heuristic = cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, ld, pref, 1, &result, &out.algos);
  out.workspace = result.workspaceSize;
  Device workspace(workspace_bytes);
  // Without an algorithm the matmul still runs its own checks (algo may be null in cuBLASLt).
  out.matmul = cublasLtMatmul(handle, desc, &s.alpha, A, la, B, lb, &s.beta, C, lc, D, ld,
                              out.algos > 0 ? &result.algo : nullptr, workspace.p, workspace_bytes, s.stream);
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto l : {la, lb, lc, ld}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  REQUIRE(cudaStreamSynchronize(s.stream) == cudaSuccess);
  cublasLtDestroy(handle);
  return out;
}

void require_ran(const Outcome& o) {
  REQUIRE(o.heuristic == CUBLAS_STATUS_SUCCESS);
  REQUIRE(o.algos == 1);
  REQUIRE(o.workspace == 0);
  REQUIRE(o.matmul == CUBLAS_STATUS_SUCCESS);
}

/// op(X)(r, c) of a stored X: X itself, or its transpose.
template <class T>
double op(const Host<T>& x, bool transposed, std::int64_t r, std::int64_t c, std::int64_t b = 0) {
  return transposed ? x(c, r, b) : x(r, c, b);
}

}  // namespace

TEST_CASE("a product written out by hand, under every transpose", "[emulation][cublaslt]") {
  // A = [1 2 3; 4 5 6], B = [7 8; 9 10; 11 12]: A B = [58 64; 139 154].
  const std::vector<float> a_n = {1, 4, 2, 5, 3, 6};     // A, 2 x 3 column-major
  const std::vector<float> a_t = {1, 2, 3, 4, 5, 6};     // A^T, 3 x 2 column-major
  const std::vector<float> b_n = {7, 9, 11, 8, 10, 12};  // B, 3 x 2
  const std::vector<float> b_t = {7, 8, 9, 10, 11, 12};  // B^T, 2 x 3
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
  Device a(ta ? a_t : a_n), b(tb ? b_t : b_n), d(std::vector<float>(4, -1.0f));
  Spec s;
  s.transa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  s.transb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  s.a = ta ? MatrixSpec{CUDA_R_32F, 3, 2, 3} : MatrixSpec{CUDA_R_32F, 2, 3, 2};
  s.b = tb ? MatrixSpec{CUDA_R_32F, 2, 3, 2} : MatrixSpec{CUDA_R_32F, 3, 2, 3};
  s.c = s.d = MatrixSpec{CUDA_R_32F, 2, 2, 2};
  require_ran(multiply(s, a.p, b.p, d.p, d.p));
  CHECK(d.back<float>() == std::vector<float>{58, 139, 64, 154});
}

TEMPLATE_TEST_CASE("every transpose with padded leading dimensions, alpha and beta, C apart or in place",
                   "[emulation][cublaslt]", float, __half, __nv_bfloat16) {
  using T = TestType;
  const std::int64_t m = 13, n = 7, k = 9;
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true), in_place = GENERATE(false, true);
  const float beta = GENERATE(0.0f, -0.5f);
  CAPTURE(ta, tb, in_place, beta);
  Host<T> a = ta ? Host<T>(k, m, 3) : Host<T>(m, k, 2);
  Host<T> b = tb ? Host<T>(n, k, 1) : Host<T>(k, n, 4);
  Host<T> c(m, n, 5), d(m, n, 3);
  a.random(1);
  b.random(2);
  c.random(3);
  // beta = 0: C is not read, so NaN in it must not reach D.
  if (beta == 0.0f && !in_place)
    for (auto& x : c.v) x = Type<T>::from(not_a_number);
  Device da(a.v), db(b.v), dc(c.v), dd(in_place ? c.v : d.v);
  Spec s;
  s.transa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  s.transb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  s.a = a.spec();
  s.b = b.spec();
  s.c = c.spec();
  s.d = in_place ? c.spec() : d.spec();
  s.alpha = 1.5f;
  s.beta = beta;
  require_ran(multiply(s, da.p, db.p, in_place ? dd.p : dc.p, dd.p));

  const Host<T> got = dd.back(in_place ? c : d);
  double worst = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::int64_t l = 0; l < k; ++l) sum += op(a, ta, i, l) * op(b, tb, l, j);
      const double want = 1.5 * sum + (beta != 0.0f ? beta * c(i, j) : 0.0);
      worst = std::max(worst, std::isnan(got(i, j)) ? 1e9 : error(got(i, j), want));
    }
  CHECK(worst <= Type<T>::bound);
  CHECK(got.padding_untouched());
}

TEMPLATE_TEST_CASE("strided batches: each item its own product, a zero stride shares an operand",
                   "[emulation][cublaslt]", float, __half, __nv_bfloat16) {
  using T = TestType;
  const std::int64_t batch = 3, m = 6, n = 5, k = 4;
  Host<T> a(m, k, 2, batch, 7);  // gaps between items, which must stay NaN
  Host<T> b(n, k, 0, 1);         // one B for every item (stride 0), transposed
  Host<T> c(m, n, 1, batch, 3), d(m, n, 2, batch, 5);
  a.random(4);
  b.random(5);
  c.random(6);
  Device da(a.v), db(b.v), dc(c.v), dd(d.v);
  Spec s;
  s.a = a.spec();
  s.b = b.spec();
  s.b.batch = batch;
  s.b.stride = 0;
  s.transb = CUBLAS_OP_T;
  s.c = c.spec();
  s.d = d.spec();
  s.alpha = 0.75f;
  s.beta = 2.0f;
  require_ran(multiply(s, da.p, db.p, dc.p, dd.p));
  const Host<T> got = dd.back(d);
  double worst = 0;
  for (std::int64_t item = 0; item < batch; ++item)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (std::int64_t l = 0; l < k; ++l) sum += a(i, l, item) * b(j, l);
        const double want = 0.75 * sum + 2.0 * c(i, j, item);
        worst = std::max(worst, std::isnan(got(i, j, item)) ? 1e9 : error(got(i, j, item), want));
      }
  CHECK(worst <= Type<T>::bound);
  CHECK(got.padding_untouched());
}

TEMPLATE_TEST_CASE("BIAS adds one entry per row of D, broadcast along its columns", "[emulation][cublaslt]", float,
                   __half, __nv_bfloat16) {
  using T = TestType;
  const std::int64_t m = 5, n = 8, k = 3;
  const std::int64_t batch = GENERATE(1, 2);
  CAPTURE(batch);
  Host<T> a(m, k, 0, batch), b(k, n, 0, batch), d(m, n, 0, batch);
  Host<T> bias(m, 1, 0, batch);  // each item its own bias, m apart
  a.random(7);
  b.random(8);
  bias.random(9);
  Device da(a.v), db(b.v), dd(d.v), dbias(bias.v);
  Spec s;
  s.a = a.spec();
  s.b = b.spec();
  s.c = s.d = d.spec();
  s.epilogue = CUBLASLT_EPILOGUE_BIAS;
  s.bias = dbias.p;
  s.bias_stride = batch > 1 ? m : 0;
  require_ran(multiply(s, da.p, db.p, dd.p, dd.p));
  const Host<T> got = dd.back(d);
  double worst = 0;
  for (std::int64_t item = 0; item < batch; ++item)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (std::int64_t l = 0; l < k; ++l) sum += a(i, l, item) * b(l, j, item);
        worst = std::max(worst, error(got(i, j, item), sum + bias(i, 0, item)));
      }
  CHECK(worst <= Type<T>::bound);
}

TEST_CASE("GELU is the tanh form", "[emulation][cublaslt]") {
  // D = gelu(1 * x) for a 1 x 1 product. The erf form gives 0.8413447 at 1: 1.5e-4 away.
  const double x = GENERATE(1.0, -0.75, 2.5);
  const double want = x == 1.0 ? 0.8411919906082768 : x == -0.75 ? -0.17003944483437966 : gelu(2.5);
  Device a(std::vector<float>{1.0f}), b(std::vector<float>{static_cast<float>(x)}), d(std::vector<float>{0.0f});
  Spec s;
  s.a = s.b = s.c = s.d = MatrixSpec{CUDA_R_32F, 1, 1, 1};
  s.epilogue = CUBLASLT_EPILOGUE_GELU;
  require_ran(multiply(s, a.p, b.p, d.p, d.p));
  CHECK(std::abs(d.back<float>()[0] - want) < 1e-6);
}

TEMPLATE_TEST_CASE("the GELU epilogues: bias before GELU, aux holds the GELU input in D's layout",
                   "[emulation][cublaslt]", float, __half, __nv_bfloat16) {
  using T = TestType;
  const std::int64_t m = 5, n = 4, k = 6;  // aux_ld 8: rows 5..7 of aux are padding
  const std::uint32_t epilogue = GENERATE(CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_AUX,
                                          CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  const bool with_bias = epilogue & CUBLASLT_EPILOGUE_BIAS, with_aux = epilogue & 128;
  CAPTURE(epilogue);
  Host<T> a(k, m), b(k, n), d(m, n, 1), aux(m, n, 3), bias(m, 1);
  a.random(10, 2.0);
  b.random(11);
  bias.random(12);
  Device da(a.v), db(b.v), dd(d.v), daux(aux.v), dbias(bias.v);
  Spec s;
  s.transa = CUBLAS_OP_T;
  s.a = a.spec();
  s.b = b.spec();
  s.c = s.d = d.spec();
  s.epilogue = epilogue;
  if (with_bias) s.bias = dbias.p;
  if (with_aux) {
    s.aux = daux.p;
    s.aux_ld = 8;
  }
  require_ran(multiply(s, da.p, db.p, dd.p, dd.p));
  const Host<T> got = dd.back(d), got_aux = daux.back(aux);
  double worst = 0, worst_aux = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double pre = with_bias ? bias(i, 0) : 0.0;
      for (std::int64_t l = 0; l < k; ++l) pre += a(l, i) * b(l, j);
      worst = std::max(worst, error(got(i, j), gelu(pre)));
      if (with_aux) worst_aux = std::max(worst_aux, error(got_aux(i, j), pre));
    }
  CHECK(worst <= Type<T>::bound);
  CHECK(worst_aux <= Type<T>::bound);
  CHECK(got.padding_untouched());
  if (with_aux) CHECK(got_aux.padding_untouched());
  if (!with_aux) CHECK(std::all_of(got_aux.v.begin(), got_aux.v.end(), [](T x) { return std::isnan(Type<T>::to(x)); }));
}

TEMPLATE_TEST_CASE("DGELU multiplies by gelu'(aux), DGELU_BGRAD sums the result over D's columns",
                   "[emulation][cublaslt]", float, __half, __nv_bfloat16) {
  using T = TestType;
  const std::int64_t m = 5, n = 9, k = 4;
  const bool bgrad = GENERATE(false, true);
  CAPTURE(bgrad);
  Host<T> a(m, k), b(n, k), d(m, n), aux(m, n, 3);
  a.random(13);
  b.random(14);
  aux.random(15, 2.0);
  std::vector<T> grad(m,
                      Type<T>::from(not_a_number));  // exactly m entries: a sum over the wrong dimension runs past them
  Device da(a.v), db(b.v), dd(d.v), daux(aux.v), dgrad(grad);
  Spec s;
  s.transb = CUBLAS_OP_T;
  s.a = a.spec();
  s.b = b.spec();
  s.c = s.d = d.spec();
  s.alpha = 0.5f;
  s.epilogue = bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
  s.aux = daux.p;
  s.aux_ld = 8;
  if (bgrad) s.bias = dgrad.p;
  require_ran(multiply(s, da.p, db.p, dd.p, dd.p));
  const Host<T> got = dd.back(d);
  const std::vector<T> got_grad = dgrad.back<T>();
  double worst = 0, worst_grad = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    double row = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::int64_t l = 0; l < k; ++l) sum += a(i, l) * b(j, l);
      const double want = 0.5 * sum * gelu_grad(aux(i, j));
      row += want;
      worst = std::max(worst, error(got(i, j), want));
    }
    if (bgrad) worst_grad = std::max(worst_grad, error(Type<T>::to(got_grad[static_cast<std::size_t>(i)]), row));
  }
  CHECK(worst <= Type<T>::bound);
  CHECK(worst_grad <= Type<T>::bound);
  if (!bgrad) CHECK(std::all_of(got_grad.begin(), got_grad.end(), [](T x) { return std::isnan(Type<T>::to(x)); }));
}

TEMPLATE_TEST_CASE("BGRADA sums op(A) over k (one per row of D), BGRADB sums op(B) over k (one per column)",
                   "[emulation][cublaslt]", float, __half, __nv_bfloat16) {
  using T = TestType;
  const std::int64_t m = 4, n = 7, k = 6;
  const bool grad_a = GENERATE(true, false);
  CAPTURE(grad_a);
  // BGRADA needs A untransposed, BGRADB needs B transposed.
  Host<T> a(m, k, 1), b(n, k, 2), d(m, n);
  a.random(16);
  b.random(17);
  const std::int64_t length = grad_a ? m : n;
  Device da(a.v), db(b.v), dd(d.v),
      dgrad(std::vector<T>(static_cast<std::size_t>(length), Type<T>::from(not_a_number)));
  Spec s;
  s.transb = CUBLAS_OP_T;
  s.a = a.spec();
  s.b = b.spec();
  s.c = s.d = d.spec();
  s.alpha = 2.0f;  // scales the product, not the sums
  s.epilogue = grad_a ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_BGRADB;
  s.bias = dgrad.p;
  require_ran(multiply(s, da.p, db.p, dd.p, dd.p));
  const Host<T> got = dd.back(d);
  const std::vector<T> got_grad = dgrad.back<T>();
  double worst = 0, worst_grad = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::int64_t l = 0; l < k; ++l) sum += a(i, l) * b(j, l);
      worst = std::max(worst, error(got(i, j), 2.0 * sum));
    }
  for (std::int64_t x = 0; x < length; ++x) {
    double sum = 0;
    for (std::int64_t l = 0; l < k; ++l) sum += grad_a ? a(x, l) : b(x, l);
    worst_grad = std::max(worst_grad, error(Type<T>::to(got_grad[static_cast<std::size_t>(x)]), sum));
  }
  CHECK(worst <= Type<T>::bound);
  CHECK(worst_grad <= Type<T>::bound);
}

TEST_CASE("a product on a stream of its own, of the second device", "[emulation][cublaslt]") {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 2) return;
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  {
    Device a(std::vector<float>{1, 4, 2, 5, 3, 6}), b(std::vector<float>{7, 9, 11, 8, 10, 12}), d(4 * sizeof(float));
    Spec s;
    s.a = MatrixSpec{CUDA_R_32F, 2, 3, 2};
    s.b = MatrixSpec{CUDA_R_32F, 3, 2, 3};
    s.c = s.d = MatrixSpec{CUDA_R_32F, 2, 2, 2};
    s.stream = stream;
    require_ran(multiply(s, a.p, b.p, d.p, d.p));
    CHECK(d.back<float>() == std::vector<float>{58, 139, 64, 154});
  }
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

namespace {
/// A valid fp32 problem D (4, 3) = A (4, 2) B (2, 3), with its buffers, that each refusal spoils.
struct Refusal {
  const char* name;
  cublasStatus_t heuristic;  // what the heuristic says (SUCCESS: it offers an algorithm)
  cublasStatus_t matmul;
  const char* message;  // part of last_fault_message() for memory faults, else empty
  std::function<void(Spec&, const void*& a, const void*& b, void*& d)> spoil;
};
}  // namespace

TEST_CASE("what cuBLASLt refuses, and what the emulation does not implement, is refused", "[emulation][cublaslt]") {
  Device a(8 * sizeof(float)), b(6 * sizeof(float)), d(12 * sizeof(float)), short_d(11 * sizeof(float));
  Device aux(24 * sizeof(float)), bias(4 * sizeof(float));
  std::vector<float> host(12, 0.0f);
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  void* other_device = nullptr;
  if (devices > 1) {
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    REQUIRE(cudaMalloc(&other_device, 6 * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
  }
  REQUIRE(cudaMemset(a.p, 0, a.bytes) == cudaSuccess);
  REQUIRE(cudaMemset(b.p, 0, b.bytes) == cudaSuccess);
  constexpr auto ok = CUBLAS_STATUS_SUCCESS, invalid = CUBLAS_STATUS_INVALID_VALUE,
                 unsupported = CUBLAS_STATUS_NOT_SUPPORTED;

  const std::vector<Refusal> cases = {
      {"the control: nothing spoiled", ok, ok, "", [](Spec&, auto&, auto&, auto&) {}},
      {"row-major order", unsupported, unsupported, "",
       [](Spec& s, auto&, auto&, auto&) { s.a.order = CUBLASLT_ORDER_ROW; }},
      {"COL32 order of D", unsupported, unsupported, "",
       [](Spec& s, auto&, auto&, auto&) { s.c.order = s.d.order = CUBLASLT_ORDER_COL32; }},
      {"ld below the rows", unsupported, invalid, "", [](Spec& s, auto&, auto&, auto&) { s.a.ld = 3; }},
      {"op(A) with k = 3, op(B) with k = 2", unsupported, invalid, "",
       [](Spec& s, auto&, auto&, auto&) { s.a.cols = 3; }},
      {"TRANSB that makes op(B) 3 x 2", unsupported, invalid, "",
       [](Spec& s, auto&, auto&, auto&) { s.transb = CUBLAS_OP_T; }},
      {"C and D of different shapes", unsupported, invalid, "", [](Spec& s, auto&, auto&, auto&) { s.c.cols = 2; }},
      {"batch counts that differ", unsupported, invalid, "", [](Spec& s, auto&, auto&, auto&) { s.a.batch = 2; }},
      {"D's batch items overlap", unsupported, invalid, "",
       [](Spec& s, auto&, auto&, auto&) {
         s.a.batch = s.b.batch = s.c.batch = s.d.batch = 2;
         s.c.stride = s.d.stride = 8;
       }},
      {"k = 0", unsupported, unsupported, "",
       [](Spec& s, auto&, auto&, auto&) {
         s.a.cols = 0;
         s.b.rows = 0;
         s.b.ld = 1;
       }},
      {"TRANSA = CUBLAS_OP_C", unsupported, unsupported, "",
       [](Spec& s, auto&, auto&, auto&) { s.transa = CUBLAS_OP_C; }},
      {"mixed data types", unsupported, unsupported, "", [](Spec& s, auto&, auto&, auto&) { s.b.type = CUDA_R_16F; }},
      {"fp64", unsupported, unsupported, "",
       [](Spec& s, auto&, auto&, auto&) { s.a.type = s.b.type = s.c.type = s.d.type = CUDA_R_64F; }},
      {"a 16-bit compute type", unsupported, unsupported, "",
       [](Spec& s, auto&, auto&, auto&) { s.compute = CUBLAS_COMPUTE_16F; }},
      {"device pointer mode", unsupported, unsupported, "",
       [](Spec& s, auto&, auto&, auto&) { s.pointer_mode = CUBLASLT_POINTER_MODE_DEVICE; }},
      {"an fp8 scale pointer", unsupported, unsupported, "", [&](Spec& s, auto&, auto&, auto&) { s.a_scale = bias.p; }},
      {"RELU, not implemented", unsupported, unsupported, "",
       [](Spec& s, auto&, auto&, auto&) { s.epilogue = CUBLASLT_EPILOGUE_RELU; }},
      {"GELU_AUX with aux_ld not divisible by 8", unsupported, invalid, "",
       [&](Spec& s, auto&, auto&, auto&) {
         s.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
         s.aux = aux.p;
         s.aux_ld = 6;
       }},
      {"GELU_AUX with aux_ld below D's rows", unsupported, invalid, "",
       [&](Spec& s, auto&, auto&, auto&) {
         s.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
         s.aux = aux.p;
         s.aux_ld = 0;
       }},
      {"DGELU with beta != 0", ok, unsupported, "",
       [&](Spec& s, auto&, auto&, auto&) {
         s.epilogue = CUBLASLT_EPILOGUE_DGELU;
         s.aux = aux.p;
         s.aux_ld = 8;
         s.beta = 1.0f;
       }},
      {"BGRADA with A transposed", unsupported, unsupported, "",
       [&](Spec& s, auto&, auto&, auto&) {
         s.epilogue = CUBLASLT_EPILOGUE_BGRADA;
         s.bias = bias.p;
         s.transa = CUBLAS_OP_T;
         s.a = MatrixSpec{CUDA_R_32F, 2, 4, 2};
       }},
      {"BGRADB with B untransposed", unsupported, unsupported, "",
       [&](Spec& s, auto&, auto&, auto&) {
         s.epilogue = CUBLASLT_EPILOGUE_BGRADB;
         s.bias = bias.p;
       }},
      {"BIAS without a bias pointer", ok, invalid, "bias",
       [](Spec& s, auto&, auto&, auto&) { s.epilogue = CUBLASLT_EPILOGUE_BIAS; }},
      {"D past the end of its allocation", ok, invalid, "past the end",
       [&](Spec&, auto&, auto&, auto& dp) { dp = short_d.p; }},
      {"A one element into its allocation, so past its end", ok, invalid, "past the end",
       [&](Spec& s, auto& ap, auto&, auto&) {
         ap = a.as<float>() + 1;
         s.promised_align_a = 4;
       }},
      {"A with an ld that reaches past the allocation", ok, invalid, "past the end",
       [](Spec& s, auto&, auto&, auto&) { s.a.ld = 5; }},
      {"a bias shorter than D's rows", ok, invalid, "past the end",
       [&](Spec& s, auto&, auto&, auto&) {
         s.epilogue = CUBLASLT_EPILOGUE_BIAS;
         s.bias = bias.as<float>() + 1;
       }},
      {"D two bytes into a float: the heuristic has nothing, the matmul faults", unsupported, invalid, "not aligned",
       [&](Spec&, auto&, auto&, auto& dp) { dp = static_cast<char*>(d.p) + 2; }},
      {"host memory for D", ok, invalid, "not device memory", [&](Spec&, auto&, auto&, auto& dp) { dp = host.data(); }},
      {"A more loosely aligned than the heuristic was promised", ok, invalid, "",
       [&](Spec& s, auto& ap, auto&, auto&) {
         s.a.rows = s.a.ld = 3;
         s.c.rows = s.d.rows = s.c.ld = s.d.ld = 3;
         ap = a.as<float>() + 1;  // 4-byte aligned; 16 promised
         s.promised_align_a = 16;
       }},
      {"A more loosely aligned, and the heuristic told so", ok, ok, "",
       [&](Spec& s, auto& ap, auto&, auto&) {
         s.a.rows = s.a.ld = 3;
         s.c.rows = s.d.rows = s.c.ld = s.d.ld = 3;
         ap = a.as<float>() + 1;
         s.promised_align_a = 4;
       }},
  };
  std::vector<Refusal> all = cases;
  if (other_device)
    all.push_back({"B in another device's memory", ok, invalid, "memory of device 1",
                   [&](Spec&, auto&, auto& bp, auto&) { bp = other_device; }});
  // An index, not the cases themselves: Catch keeps a generator across the runs of a test case,
  // and the cases' lambdas refer to this run's buffers.
  const Refusal& c = all[GENERATE_COPY(range(std::size_t(0), all.size()))];
  CAPTURE(c.name);
  Spec s;
  s.a = MatrixSpec{CUDA_R_32F, 4, 2, 4};
  s.b = MatrixSpec{CUDA_R_32F, 2, 3, 2};
  s.c = s.d = MatrixSpec{CUDA_R_32F, 4, 3, 4};
  const void* ap = a.p;
  const void* bp = b.p;
  void* dp = d.p;
  c.spoil(s, ap, bp, dp);
  const Outcome o = multiply(s, ap, bp, dp, dp);
  CHECK(o.heuristic == c.heuristic);
  CHECK(o.algos == (c.heuristic == ok ? 1 : 0));
  CHECK(o.matmul == c.matmul);
  if (*c.message) {
    const std::string message = polyshard::emulation::last_fault_message();
    CHECK(message.find("cublasLtMatmul") != std::string::npos);
    CHECK(message.find(c.message) != std::string::npos);
    CHECK(cudaGetLastError() != cudaSuccess);  // reported as a launch error, and cleared here
  }
  CHECK(cudaGetLastError() == cudaSuccess);

  if (other_device) {
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    cudaFree(other_device);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
  }
}

TEST_CASE("descriptor attributes: sizes checked, values kept, unknown attributes refused", "[emulation][cublaslt]") {
  cublasLtMatmulDesc_t desc = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const std::int32_t t = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)) == CUBLAS_STATUS_SUCCESS);
  const std::int64_t wide = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulDescSetAttribute(desc, static_cast<cublasLtMatmulDescAttributes_t>(9), &t, sizeof(t)) ==
        CUBLAS_STATUS_INVALID_VALUE);
  std::int32_t back = -1;
  std::size_t written = 0;
  CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &back, sizeof(back), &written) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(back == CUBLAS_OP_T);
  CHECK(written == sizeof(back));
  CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0, &written) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(written == sizeof(std::int64_t));
  std::uint32_t epilogue = 0;
  CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue), nullptr) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(epilogue == CUBLASLT_EPILOGUE_DEFAULT);
  CHECK(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS);

  cublasLtMatrixLayout_t layout = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 5, 3, 8) == CUBLAS_STATUS_SUCCESS);
  std::uint64_t rows = 0;
  CHECK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(rows), nullptr) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(rows == 5);
  const std::int32_t small_count = 4;
  CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &small_count,
                                         sizeof(small_count)) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS);

  cublasLtMatmulPreference_t pref = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  std::uint32_t align = 0;
  CHECK(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof(align),
                                             nullptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(align == 256);  // cuBLASLt's documented default
  std::uint64_t workspace = 1;
  CHECK(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof(workspace), nullptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(workspace == 0);
  CHECK(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);

  CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(!std::string(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE)).empty());
  CHECK(cublasLtGetVersion() == CUBLAS_VERSION);
}

TEST_CASE("the heuristic needs no workspace: it offers its algorithm with none allowed", "[emulation][cublaslt]") {
  cublasLtHandle_t handle = nullptr;
  REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t l = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);  // max workspace 0
  cublasLtMatmulHeuristicResult_t results[3]{};
  int count = -1;
  CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, l, l, l, l, pref, 3, results, &count) == CUBLAS_STATUS_SUCCESS);
  CHECK(count == 1);
  CHECK(results[0].state == CUBLAS_STATUS_SUCCESS);
  CHECK(results[0].workspaceSize == 0);
  CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, l, l, l, l, pref, 0, results, &count) ==
        CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(handle);
}
