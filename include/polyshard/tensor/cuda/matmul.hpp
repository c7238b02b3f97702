// Matrix products on the GPU through cuBLASLt: row-major C = alpha op(A) op(B) + beta C, strided
// batches, fp32 accumulation, and the fused epilogues a transformer uses (bias, GELU, gradients).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/element_fwd.hpp"
#include "polyshard/core/error.hpp"

namespace polyshard::cuda {

/// Throws polyshard::Error("polyshard: <call> failed: <status name>: <description> (<file>:<line>)").
inline void check_cublas(cublasStatus_t rc, const char* call, const char* file, int line) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string("polyshard: ") + call + " failed: " + cublasLtGetStatusName(rc) + ": " +
              cublasLtGetStatusString(rc) + " (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace polyshard::cuda

/// Runs a cuBLAS / cuBLASLt call and throws polyshard::Error when it does not return CUBLAS_STATUS_SUCCESS.
#define POLYSHARD_CUBLAS_CHECK(call) ::polyshard::cuda::check_cublas((call), #call, __FILE__, __LINE__)

namespace polyshard::cuda {

// ---------------------------------------------------------------------------------------------
// Row-major products on a column-major library.
//
// cuBLASLt reads every matrix column-major. A row-major X of r rows, c columns and row stride
// ld occupies exactly the bytes of the column-major X^T (c rows, r columns, leading dimension
// ld). So the row-major C = op(A) op(B) is, byte for byte, the column-major C^T = op(B)^T op(A)^T:
// we hand cuBLASLt our B as its "A" and our A as its "B", with its m = our n, its n = our m, and
// k unchanged. No matrix is copied, and the layouts stay the column-major ones that cuBLASLt's
// epilogues are documented for (rather than CUBLASLT_ORDER_ROW). Each operand keeps its own
// transpose flag: our B stored (k, n) is, read column-major, (n, k) = op(B)^T already, so its
// flag is N; stored (n, k) (a transposed view, as a linear layer's weight) it reads as (k, n)
// and needs T. Likewise for A.
//
// The epilogues follow from the same swap, and this is where the direction is easy to get wrong:
//  - cuBLASLt's bias has one entry per row of its D and is broadcast over its columns. Its D is
//    our C^T, so its rows are our columns: the bias has n entries and bias[j] is added to every
//    C(i, j), i.e. broadcast over our rows, which is a linear layer's bias.
//  - The GELU aux matrix has D's layout: our (m, n) row-major with row stride aux_ld, where
//    cuBLASLt asks aux_ld >= its rows (our n) and aux_ld divisible by 8.
//  - BGRADA sums its A (our op(B)) over k: n entries, the column sums of op(B).
//    BGRADB sums its B (our op(A)) over k: m entries, the row sums of op(A).
//    A row-major linear layer Y (N, out) = X (N, in) W^T + b computes dW (out, in) = dY^T X with
//    A = dY (stored (N, out), transposed view), B = X, k = N: db = sum over the N rows of dY =
//    the row sums of op(A) = BGRADB, which Epilogue::BiasGradA names.
//  - DGELU_BGRAD's bias gradient has one entry per row of its D: n entries, summed over our rows.
// ---------------------------------------------------------------------------------------------

/// What cuBLASLt does to alpha op(A) op(B) + beta C before it stores C. Shapes are row-major and
/// use MatmulArgs' m, n and k; `bias`, `bias_grad` and `aux` are MatmulArgs fields.
enum class Epilogue : std::uint8_t {
  None,           ///< C = alpha op(A) op(B) + beta C
  Bias,           ///< C = ... + bias, bias: (n) broadcast over the m rows
  BiasGelu,       ///< C = gelu(... + bias), GELU's tanh form (as GPT-2's)
  BiasGeluAux,    ///< as BiasGelu, and aux: (m, n) receives the GELU input (for the backward)
  DGelu,          ///< C = (alpha op(A) op(B)) * gelu'(aux), aux: (m, n) the saved GELU input; beta must be 0
  DGeluBiasGrad,  ///< as DGelu, and bias_grad: (n) receives the column sums of the new C (sum over rows)
  BiasGradA,      ///< plain product, and bias_grad: (m) receives the row sums of op(A) (over k); needs trans_a
  BiasGradB,      ///< plain product, and bias_grad: (n) receives the column sums of op(B) (over k); needs !trans_b
};
// The bias gradients are sums of the operand as stored, not scaled by alpha. cuBLASLt reduces
// an operand only while it streams it along k: its BGRADB wants its B transposed and its BGRADA
// wants its A not transposed, which after the swap are the trans_a and !trans_b above.

/// Its name in messages ("bias+gelu").
constexpr const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::None: return "none";
    case Epilogue::Bias: return "bias";
    case Epilogue::BiasGelu: return "bias+gelu";
    case Epilogue::BiasGeluAux: return "bias+gelu+aux";
    case Epilogue::DGelu: return "dgelu";
    case Epilogue::DGeluBiasGrad: return "dgelu+bias-grad";
    case Epilogue::BiasGradA: return "bias-grad-a";
    case Epilogue::BiasGradB: return "bias-grad-b";
  }
  return "?";
}

namespace detail {
template <class>
inline constexpr bool always_false_v = false;

/// cuBLASLt's name of an element type. The 16-bit types are only declared here (no Eigen), so
/// sizes come from this table, never from sizeof.
template <class T>
struct LtElement {
  static_assert(always_false_v<T>, "cuda::matmul multiplies float, half or bfloat16 matrices");
};
template <>
struct LtElement<float> {
  static constexpr cudaDataType_t type = CUDA_R_32F;
  static constexpr std::uint32_t bytes = 4;
  static constexpr const char* name = "fp32";
};
template <>
struct LtElement<half> {
  static constexpr cudaDataType_t type = CUDA_R_16F;
  static constexpr std::uint32_t bytes = 2;
  static constexpr const char* name = "fp16";
};
template <>
struct LtElement<bfloat16> {
  static constexpr cudaDataType_t type = CUDA_R_16BF;
  static constexpr std::uint32_t bytes = 2;
  static constexpr const char* name = "bf16";
};

constexpr bool uses_bias_input(Epilogue e) {
  return e == Epilogue::Bias || e == Epilogue::BiasGelu || e == Epilogue::BiasGeluAux;
}
constexpr bool writes_bias_grad(Epilogue e) {
  return e == Epilogue::DGeluBiasGrad || e == Epilogue::BiasGradA || e == Epilogue::BiasGradB;
}
constexpr bool uses_aux(Epilogue e) {
  return e == Epilogue::BiasGeluAux || e == Epilogue::DGelu || e == Epilogue::DGeluBiasGrad;
}

constexpr cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::BiasGelu: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::BiasGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::DGeluBiasGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    // Swapped on purpose: our A is cuBLASLt's B (see the comment at the top of this file).
    case Epilogue::BiasGradA: return CUBLASLT_EPILOGUE_BGRADB;
    case Epilogue::BiasGradB: return CUBLASLT_EPILOGUE_BGRADA;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

/// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address;
/// 0 for a null pointer.
inline std::uint32_t alignment_of(const void* p) {
  if (!p) return 0;
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 1;
  while (a < 256 && (address & a) == 0) a <<= 1;
  return a;
}

/// The alignment every item of a strided batch keeps: the first item's, lowered to the largest
/// power of two that also divides the stride in bytes (a stride of 0 keeps it).
inline std::uint32_t batch_alignment(std::uint32_t first, std::int64_t stride, std::uint32_t bytes) {
  const auto step = static_cast<std::uint64_t>(stride) * bytes;
  while (first > 1 && step % first != 0) first >>= 1;
  return first;
}

/// Everything cuBLASLt's choice of algorithm depends on: the cache key of a plan. Pointer
/// values are not in it (they change every call), their alignments are.
struct PlanKey {
  cudaDataType_t type = CUDA_R_32F;
  bool tf32 = false;
  Epilogue epilogue = Epilogue::None;
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0, aux_ld = 0;
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0, align_aux = 0;
  auto operator<=>(const PlanKey&) const = default;
};

inline std::string describe(const PlanKey& key) {
  const char* type = key.type == CUDA_R_32F   ? (key.tf32 ? "fp32 (tf32 allowed)" : "fp32")
                     : key.type == CUDA_R_16F ? "fp16"
                                              : "bf16";
  std::ostringstream s;
  s << type << " C(" << key.m << ", " << key.n << ") = A" << (key.trans_a ? "^T" : "") << " B"
    << (key.trans_b ? "^T" : "") << " with k = " << key.k << " (lda " << key.lda << ", ldb " << key.ldb << ", ldc "
    << key.ldc << "), batch " << key.batch << " (strides " << key.stride_a << ", " << key.stride_b << ", "
    << key.stride_c << "), epilogue " << epilogue_name(key.epilogue);
  if (uses_aux(key.epilogue)) s << " (aux_ld " << key.aux_ld << ")";
  s << ", pointer alignments A " << key.align_a << ", B " << key.align_b << ", C " << key.align_c;
  if (uses_bias_input(key.epilogue) || writes_bias_grad(key.epilogue)) s << ", bias " << key.align_bias;
  if (uses_aux(key.epilogue)) s << ", aux " << key.align_aux;
  s << " bytes";
  return s.str();
}

struct LtDescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LtLayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct LtPreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using LtDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, LtDescDeleter>;
using LtLayout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LtLayoutDeleter>;
using LtPreference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, LtPreferenceDeleter>;

/// A problem's descriptors and the algorithm cuBLASLt's heuristic ranked first. In cuBLASLt's
/// (column-major, swapped) terms: lt_a describes our B, lt_b our A, lt_c our C.
struct Plan {
  LtDesc desc;
  LtLayout lt_a, lt_b, lt_c;
  cublasLtMatmulAlgo_t algo{};
};
}  // namespace detail

/// One cuBLASLt handle per thread and device, with its workspaces and its cache of plans.
/// Everything in it belongs to the calling thread, so nothing is locked.
class CublasLt {
 public:
  /// Workspace per stream: 32 MiB lets the Hopper kernels (and split-K) the heuristic prefers run.
  static constexpr std::size_t workspace_bytes = std::size_t(32) << 20;

  /// The calling thread's handle for its current device, created on first use.
  static CublasLt& current() {
    int device = 0;
    POLYSHARD_CUDA_CHECK(cudaGetDevice(&device));
    thread_local std::map<int, std::unique_ptr<CublasLt>> handles;
    auto& h = handles[device];
    if (!h) h.reset(new CublasLt(device));
    return *h;
  }

  ~CublasLt() {
    // At thread (or process) exit the runtime may already be going away: nothing is checked.
    plans_.clear();
    for (auto& [stream, w] : workspaces_) cudaFree(w.memory);
    cublasLtDestroy(handle_);
  }
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  cublasLtHandle_t handle() const { return handle_; }
  int device() const { return device_; }

  /// The workspace of matmuls issued to `stream`. One per stream, because two streams may run
  /// at once and a shared workspace would be written by both. It comes from cudaMalloc, not
  /// from the stream-ordered pool: it lives as long as this thread, longer than the streams it
  /// serves, and a stream-ordered free needs a live stream. A handle is kept with its stream's
  /// id (cudaStreamGetId, unique for the life of the program): a destroyed stream's handle can
  /// come back for a new stream while the old one's products still run in its workspace, so a
  /// new id for a known handle waits for the device, frees that workspace and takes a new one.
  void* workspace(cudaStream_t stream) {
    unsigned long long id = 0;
    POLYSHARD_CUDA_CHECK(cudaStreamGetId(stream, &id));
    Workspace& w = workspaces_[stream];
    if (w.memory && w.stream_id != id) {
      POLYSHARD_CUDA_CHECK(cudaDeviceSynchronize());
      POLYSHARD_CUDA_CHECK(cudaFree(w.memory));
      w.memory = nullptr;
    }
    if (!w.memory) {
      const cudaError_t rc = cudaMalloc(&w.memory, workspace_bytes);
      if (rc != cudaSuccess) {
        cudaGetLastError();  // not sticky: later checks must not see this one
        workspaces_.erase(stream);
        check(rc, "cudaMalloc of the 32 MiB cuBLASLt workspace", __FILE__, __LINE__);
      }
      w.stream_id = id;
    }
    return w.memory;
  }

  /// The id of the stream whose workspace `stream`'s handle holds now (for tests).
  unsigned long long workspace_stream_id(cudaStream_t stream) const {
    const auto it = workspaces_.find(stream);
    return it == workspaces_.end() ? 0 : it->second.stream_id;
  }

  /// The plan of `key`, built (descriptors, layouts, heuristic) the first time it is asked for.
  /// `bias` and `aux` are the first call's pointers, which the heuristic reads for alignment.
  detail::Plan& plan(const detail::PlanKey& key, const void* bias, const void* aux);

  /// How many problems have a cached plan (for tests).
  std::size_t cached_plans() const { return plans_.size(); }

 private:
  explicit CublasLt(int device) : device_(device) { POLYSHARD_CUBLAS_CHECK(cublasLtCreate(&handle_)); }

  int device_ = 0;
  cublasLtHandle_t handle_ = nullptr;
  struct Workspace {
    unsigned long long stream_id = 0;
    void* memory = nullptr;
  };
  std::map<cudaStream_t, Workspace> workspaces_;
  std::map<detail::PlanKey, std::unique_ptr<detail::Plan>> plans_;
};

/// One matrix product, row-major throughout: C = alpha op(A) op(B) + beta C, then the epilogue.
/// op(A): (m, k), stored (m, k) or, with trans_a, (k, m) (a transposed view); the same for
/// op(B): (k, n) stored (k, n) or (n, k). C: (m, n). Every leading dimension is the stride
/// between rows of the matrix as stored, in elements; 0 means packed (the stored row length).
/// A, B and C share the element type T (float, half or bfloat16); products accumulate in fp32
/// and alpha, beta are fp32.
template <class T>
struct MatmulArgs {
  std::int64_t m = 0, n = 0, k = 0;
  const T* a = nullptr;  ///< (m, k) or, with trans_a, (k, m)
  std::int64_t lda = 0;  ///< >= k, or >= m with trans_a; 0: packed
  bool trans_a = false;
  const T* b = nullptr;  ///< (k, n) or, with trans_b, (n, k)
  std::int64_t ldb = 0;  ///< >= n, or >= k with trans_b; 0: packed
  bool trans_b = false;
  T* c = nullptr;        ///< (m, n): read when beta != 0, always written
  std::int64_t ldc = 0;  ///< >= n; 0: packed
  float alpha = 1.0f;
  float beta = 0.0f;

  /// Strided batches: batch_count products, item i at a + i * stride_a (and so on), strides in
  /// elements. A stride of 0 for A or B shares that operand across the batch; C's items must
  /// not overlap. The bias is shared across the batch; aux and bias-gradient epilogues take one
  /// product only.
  std::int64_t batch_count = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;

  Epilogue epilogue = Epilogue::None;
  /// Bias (n), added by Bias, BiasGelu and BiasGeluAux.
  const T* bias = nullptr;
  /// Bias gradient, written (overwritten, never accumulated) by DGeluBiasGrad (n), BiasGradA (m)
  /// and BiasGradB (n).
  T* bias_grad = nullptr;
  /// GELU input (m, n) with row stride aux_ld: written by BiasGeluAux, read by DGelu and
  /// DGeluBiasGrad. cuBLASLt requires aux_ld >= n and divisible by 8; 0 means n rounded up to 8.
  T* aux = nullptr;
  std::int64_t aux_ld = 0;

  /// float only: let cuBLASLt round the inputs to TF32 on tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32,
  /// about 3 significant digits). Off by default, so that fp32 products match the CPU's. The
  /// 16-bit types ignore it: they multiply on tensor cores in their own precision.
  bool allow_tf32 = false;
};

namespace detail {

/// Checks `args` and fills in packed leading dimensions; throws polyshard::Error with a sentence.
template <class T>
PlanKey validated_key(MatmulArgs<T>& args) {
  using E = LtElement<T>;
  constexpr std::int64_t int_max = std::numeric_limits<std::int32_t>::max();
  // The start of every message; built only when a check fails.
  const auto what = [&args] {
    return std::string("polyshard: cuda::matmul (") + E::name + ", C(" + std::to_string(args.m) + ", " +
           std::to_string(args.n) + ") with k = " + std::to_string(args.k) + "): ";
  };
  POLYSHARD_CHECK(args.m >= 0 && args.n >= 0 && args.k >= 0, what(), "m, n and k must not be negative");
  POLYSHARD_CHECK(args.m <= int_max && args.n <= int_max && args.k <= int_max, what(),
                  "m, n and k must fit in 32 bits, as cuBLASLt's matrix layouts need");
  POLYSHARD_CHECK(args.k >= 1 || args.m == 0 || args.n == 0, what(),
                  "k = 0 (an empty inner dimension) is not a product cuBLASLt computes; scale or fill C instead");
  POLYSHARD_CHECK(args.batch_count >= 1 && args.batch_count <= int_max, what(), "batch_count is ", args.batch_count,
                  ", it must be between 1 and 2^31 - 1");

  const std::int64_t a_cols = args.trans_a ? args.m : args.k;  // A's row length as stored
  const std::int64_t b_cols = args.trans_b ? args.k : args.n;
  if (args.lda == 0) args.lda = a_cols;
  if (args.ldb == 0) args.ldb = b_cols;
  if (args.ldc == 0) args.ldc = args.n;
  POLYSHARD_CHECK(args.lda >= a_cols, what(), "lda = ", args.lda, " is shorter than A's stored rows of ", a_cols,
                  args.trans_a ? " (A is transposed: stored (k, m))" : " (A is stored (m, k))");
  POLYSHARD_CHECK(args.ldb >= b_cols, what(), "ldb = ", args.ldb, " is shorter than B's stored rows of ", b_cols,
                  args.trans_b ? " (B is transposed: stored (n, k))" : " (B is stored (k, n))");
  POLYSHARD_CHECK(args.ldc >= args.n, what(), "ldc = ", args.ldc, " is shorter than C's rows of n = ", args.n);

  const Epilogue e = args.epilogue;
  if (uses_aux(e) && args.aux_ld == 0) args.aux_ld = (args.n + 7) / 8 * 8;
  if (args.m == 0 || args.n == 0) return {};  // nothing to compute; the caller returns

  POLYSHARD_CHECK(args.a && args.b && args.c, what(), "A, B and C must be device pointers, got ",
                  args.a ? "" : "a null A ", args.b ? "" : "a null B ", args.c ? "" : "a null C");
  std::uint32_t align_a = alignment_of(args.a), align_b = alignment_of(args.b), align_c = alignment_of(args.c);
  POLYSHARD_CHECK(align_a >= E::bytes && align_b >= E::bytes && align_c >= E::bytes, what(),
                  "A, B and C must be aligned to their ", E::bytes, "-byte elements (alignments ", align_a, ", ",
                  align_b, ", ", align_c, " bytes)");

  if (args.batch_count > 1) {
    POLYSHARD_CHECK(args.stride_a >= 0 && args.stride_b >= 0, what(), "batch strides of A and B must not be negative (",
                    args.stride_a, ", ", args.stride_b, "); 0 shares the operand across the batch");
    const std::int64_t c_item = (args.m - 1) * args.ldc + args.n;  // elements one C item spans
    POLYSHARD_CHECK(args.stride_c >= c_item, what(), "stride_c = ", args.stride_c, " makes the ", args.batch_count,
                    " outputs overlap: each spans ", c_item, " elements");
    POLYSHARD_CHECK(!uses_aux(e) && !writes_bias_grad(e), what(), "the ", epilogue_name(e),
                    " epilogue takes one product, not a batch of ", args.batch_count);
    // The heuristic's alignment preferences must hold for every item, not only the first: an
    // item stride of, say, 43 fp16 elements leaves the later items 2-byte aligned.
    align_a = batch_alignment(align_a, args.stride_a, E::bytes);
    align_b = batch_alignment(align_b, args.stride_b, E::bytes);
    align_c = batch_alignment(align_c, args.stride_c, E::bytes);
  }

  std::uint32_t align_bias = 0, align_aux = 0;
  if (uses_bias_input(e)) {
    POLYSHARD_CHECK(args.bias, what(), "the ", epilogue_name(e), " epilogue needs the bias it adds, got null");
    align_bias = alignment_of(args.bias);
  } else {
    POLYSHARD_CHECK(!args.bias, what(), "a bias was given but the epilogue (", epilogue_name(e),
                    ") does not add one: choose Epilogue::Bias, BiasGelu or BiasGeluAux");
  }
  if (writes_bias_grad(e)) {
    POLYSHARD_CHECK(args.bias_grad, what(), "the ", epilogue_name(e),
                    " epilogue needs bias_grad, where the bias gradient goes, got null");
    align_bias = alignment_of(args.bias_grad);
  } else {
    POLYSHARD_CHECK(!args.bias_grad, what(), "a bias_grad was given but the epilogue (", epilogue_name(e),
                    ") does not write one: choose DGeluBiasGrad, BiasGradA or BiasGradB");
  }
  POLYSHARD_CHECK(align_bias == 0 || align_bias >= E::bytes, what(),
                  "the bias (or its gradient) must be aligned to its ", E::bytes, "-byte elements");
  if (uses_aux(e)) {
    POLYSHARD_CHECK(args.aux, what(), "the ", epilogue_name(e), " epilogue needs an aux pointer (",
                    e == Epilogue::BiasGeluAux ? "where the GELU input goes" : "the saved GELU input", "), got null");
    POLYSHARD_CHECK(args.aux_ld >= args.n && args.aux_ld % 8 == 0, what(), "aux_ld = ", args.aux_ld,
                    " must be at least n = ", args.n, " and divisible by 8, as cuBLASLt requires of the GELU aux");
    align_aux = alignment_of(args.aux);
    POLYSHARD_CHECK(align_aux >= E::bytes, what(), "aux must be aligned to its ", E::bytes, "-byte elements");
  } else {
    POLYSHARD_CHECK(!args.aux, what(), "an aux pointer was given but the epilogue (", epilogue_name(e),
                    ") does not use one");
  }
  POLYSHARD_CHECK(e != Epilogue::BiasGradA || args.trans_a, what(),
                  "cuBLASLt sums A into a bias gradient only when A is a transposed view, as dY is in a weight "
                  "gradient dW = dY^T X; set trans_a with A stored (k, m)");
  POLYSHARD_CHECK(e != Epilogue::BiasGradB || !args.trans_b, what(),
                  "cuBLASLt sums B into a bias gradient only when B is not transposed, as dY is in dW^T = X^T dY; "
                  "store B as (k, n)");
  POLYSHARD_CHECK(!(e == Epilogue::DGelu || e == Epilogue::DGeluBiasGrad) || args.beta == 0.0f, what(), "the ",
                  epilogue_name(e), " epilogue multiplies the product by gelu'(aux): beta must be 0, got ", args.beta);

  PlanKey key;
  key.type = E::type;
  key.tf32 = std::is_same_v<T, float> && args.allow_tf32;
  key.epilogue = e;
  key.trans_a = args.trans_a;
  key.trans_b = args.trans_b;
  key.m = args.m;
  key.n = args.n;
  key.k = args.k;
  key.lda = args.lda;
  key.ldb = args.ldb;
  key.ldc = args.ldc;
  key.aux_ld = uses_aux(e) ? args.aux_ld : 0;
  key.batch = args.batch_count;
  if (args.batch_count > 1) {
    key.stride_a = args.stride_a;
    key.stride_b = args.stride_b;
    key.stride_c = args.stride_c;
  }
  key.align_a = align_a;
  key.align_b = align_b;
  key.align_c = align_c;
  key.align_bias = align_bias;
  key.align_aux = align_aux;
  return key;
}

template <class V>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value, const char* name) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), name, __FILE__, __LINE__);
}

/// Points the descriptor at this call's bias and aux (a cached plan holds the previous call's).
inline void set_epilogue_pointers(cublasLtMatmulDesc_t desc, Epilogue e, const void* bias, const void* aux) {
  if (uses_bias_input(e) || writes_bias_grad(e))
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  if (uses_aux(e))
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux,
             "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
}

inline LtLayout make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                            std::int64_t batch, std::int64_t stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  POLYSHARD_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&raw, type, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld));
  LtLayout layout(raw);
  if (batch > 1) {
    const std::int32_t count = static_cast<std::int32_t>(batch);
    POLYSHARD_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    const std::int64_t offset = stride;
    POLYSHARD_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof(offset)));
  }
  return layout;
}

inline std::unique_ptr<Plan> build_plan(cublasLtHandle_t handle, const PlanKey& key, const void* bias,
                                        const void* aux) {
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw = nullptr;
  POLYSHARD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw, compute, CUDA_R_32F));  // fp32 alpha and beta
  plan->desc.reset(raw);

  // cuBLASLt's A is our B and its B is our A (see the top of this file).
  const std::int32_t op_lt_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const std::int32_t op_lt_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(raw, CUBLASLT_MATMUL_DESC_TRANSA, op_lt_a, "cublasLtMatmulDescSetAttribute(TRANSA)");
  set_desc(raw, CUBLASLT_MATMUL_DESC_TRANSB, op_lt_b, "cublasLtMatmulDescSetAttribute(TRANSB)");
  const std::uint32_t epilogue = lt_epilogue(key.epilogue);
  set_desc(raw, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  if (uses_aux(key.epilogue)) {
    const std::int64_t aux_ld = key.aux_ld;
    set_desc(raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld, "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
  }
  // The heuristic reads the bias and aux pointers for their alignment (never dereferences them).
  set_epilogue_pointers(raw, key.epilogue, bias, aux);

  // Column-major views of the row-major operands: stored (r, c) with row stride ld reads as (c, r).
  // Our B, stored (n, k) when transposed, else (k, n):
  plan->lt_a = key.trans_b ? make_layout(key.type, key.k, key.n, key.ldb, key.batch, key.stride_b)
                           : make_layout(key.type, key.n, key.k, key.ldb, key.batch, key.stride_b);
  // Our A, stored (k, m) when transposed, else (m, k):
  plan->lt_b = key.trans_a ? make_layout(key.type, key.m, key.k, key.lda, key.batch, key.stride_a)
                           : make_layout(key.type, key.k, key.m, key.lda, key.batch, key.stride_a);
  // Our C, stored (m, n): cuBLASLt's D of n rows and m columns.
  plan->lt_c = make_layout(key.type, key.n, key.m, key.ldc, key.batch, key.stride_c);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  POLYSHARD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
  LtPreference pref(raw_pref);
  const std::uint64_t max_workspace = CublasLt::workspace_bytes;
  POLYSHARD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                              &max_workspace, sizeof(max_workspace)));
  // cuBLASLt assumes 256-byte aligned matrices unless told; views into larger buffers are not.
  // Again swapped: its A is our B.
  const std::uint32_t align_lt_a = key.align_b, align_lt_b = key.align_a, align_lt_c = key.align_c;
  POLYSHARD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                              &align_lt_a, sizeof(align_lt_a)));
  POLYSHARD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                              &align_lt_b, sizeof(align_lt_b)));
  POLYSHARD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                              &align_lt_c, sizeof(align_lt_c)));
  POLYSHARD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                              &align_lt_c, sizeof(align_lt_c)));

  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(
      handle, raw, plan->lt_a.get(), plan->lt_b.get(), plan->lt_c.get(), plan->lt_c.get(), raw_pref, 1, &best, &found);
  if (rc == CUBLAS_STATUS_NOT_SUPPORTED ||
      (rc == CUBLAS_STATUS_SUCCESS && (found == 0 || best.state != CUBLAS_STATUS_SUCCESS)))
    throw Error("polyshard: cuda::matmul: cuBLASLt offers no algorithm for " + describe(key) +
                " on this device (its heuristic returned none)");
  POLYSHARD_CUBLAS_CHECK(rc);
  plan->algo = best.algo;
  return plan;
}
}  // namespace detail

inline detail::Plan& CublasLt::plan(const detail::PlanKey& key, const void* bias, const void* aux) {
  auto it = plans_.find(key);
  if (it == plans_.end()) it = plans_.emplace(key, detail::build_plan(handle_, key, bias, aux)).first;
  return *it->second;
}

namespace detail {

/// Whether the environment sets POLYSHARD_CLEAR_PRODUCT_OUTPUTS=1: then matmul clears what a
/// product writes (C where beta is 0, aux, the bias gradient) before cuBLASLt writes it. For
/// compute-sanitizer's initcheck only: on Hopper it does not see the stores of the kernels
/// cuBLASLt picks there (an output equal to the CPU's product at every element is reported
/// uninitialized when read; test_cuda_matmul's "[fresh-output]" case), so every read of a
/// product's output is reported. Cleared first, what initcheck reports is left to memory nothing
/// wrote. Off by default: it costs a memset of every output.
inline bool clear_product_outputs() {
  static const bool on = [] {
    const char* v = std::getenv("POLYSHARD_CLEAR_PRODUCT_OUTPUTS");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

/// Zeros, in `stream`, every element the product of `args` (validated: leading dimensions filled
/// in) writes without reading it first; gaps between rows and batch items are left alone.
template <class T>
void clear_outputs(const MatmulArgs<T>& args, cudaStream_t stream) {
  const std::size_t e = sizeof(T);
  if (args.beta == 0.0f)
    for (std::int64_t i = 0; i < args.batch_count; ++i)
      POLYSHARD_CUDA_CHECK(cudaMemset2DAsync(args.c + i * args.stride_c, std::size_t(args.ldc) * e, 0,
                                             std::size_t(args.n) * e, std::size_t(args.m), stream));
  if (args.epilogue == Epilogue::BiasGeluAux)
    POLYSHARD_CUDA_CHECK(cudaMemset2DAsync(args.aux, std::size_t(args.aux_ld) * e, 0, std::size_t(args.n) * e,
                                           std::size_t(args.m), stream));
  if (writes_bias_grad(args.epilogue))
    POLYSHARD_CUDA_CHECK(cudaMemsetAsync(
        args.bias_grad, 0, std::size_t(args.epilogue == Epilogue::BiasGradA ? args.m : args.n) * e, stream));
}

}  // namespace detail

/// Computes `args` (see MatmulArgs) in `stream` with the calling thread's cuBLASLt handle of the
/// current device. The first call of a problem builds its descriptors and asks cuBLASLt's
/// heuristic for an algorithm; later calls with the same problem (shapes, strides, types,
/// epilogue, pointer alignments) reuse them. Throws polyshard::Error, naming the problem, for
/// invalid arguments, for a problem cuBLASLt has no algorithm for, and for a failed launch.
template <class T>
void matmul(const MatmulArgs<T>& given, cudaStream_t stream) {
  MatmulArgs<T> args = given;
  const detail::PlanKey key = detail::validated_key(args);
  if (args.m == 0 || args.n == 0) return;
  CublasLt& lt = CublasLt::current();
  // cuBLASLt has one vector pointer: the bias it reads or the bias gradient it writes.
  const void* vector = detail::uses_bias_input(args.epilogue) ? static_cast<const void*>(args.bias)
                                                              : static_cast<const void*>(args.bias_grad);
  detail::Plan& plan = lt.plan(key, vector, args.aux);
  detail::set_epilogue_pointers(plan.desc.get(), args.epilogue, vector, args.aux);
  void* workspace = lt.workspace(stream);
  if (detail::clear_product_outputs()) detail::clear_outputs(args, stream);
  // Swapped operands: cuBLASLt's A is our B, its B our A; C is read (beta) and written in place.
  const cublasStatus_t rc = cublasLtMatmul(lt.handle(), plan.desc.get(), &args.alpha, args.b, plan.lt_a.get(), args.a,
                                           plan.lt_b.get(), &args.beta, args.c, plan.lt_c.get(), args.c,
                                           plan.lt_c.get(), &plan.algo, workspace, CublasLt::workspace_bytes, stream);
  if (rc != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("polyshard: cublasLtMatmul failed: ") + cublasLtGetStatusName(rc) + ": " +
                cublasLtGetStatusString(rc) + " for " + detail::describe(key));
}

}  // namespace polyshard::cuda
