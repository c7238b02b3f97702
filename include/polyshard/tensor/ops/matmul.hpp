// Matrix products: C = alpha * A B + beta * C over the last two dimensions, batched over the
// leading ones, with either operand given as a transposed view.
#pragma once

#include <Eigen/Core>
#include <type_traits>

#include "polyshard/core/precompiled.hpp"
#include "polyshard/tensor/cpu/blas.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

namespace detail {
/// How a 2-D strided view is handed to a row-major GEMM: transposed or not, and its leading
/// dimension. Views whose rows and columns are both strided are copied first by the caller.
struct MatrixLayout {
  bool transposed;
  std::int64_t ld;
};

template <class T, class D>
bool gemm_layout(const Tensor<T, D>& t, MatrixLayout& out) {
  const std::int64_t rows = t.size(-2), cols = t.size(-1);
  const std::int64_t s_row = t.strides()[t.rank() - 2], s_col = t.strides()[t.rank() - 1];
  if (s_col == 1 && s_row >= std::max<std::int64_t>(cols, 1)) {
    out = {false, s_row};
    return true;
  }
  if (s_row == 1 && s_col >= std::max<std::int64_t>(rows, 1)) {
    out = {true, s_col};
    return true;
  }
  return false;
}

template <class T>
void gemm_2d(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
             const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  const cpu::Blas& blas = cpu::blas();
  if (k > 0 && blas.available()) {
    const int opa = ta ? cpu::Blas::trans : cpu::Blas::no_trans;
    const int opb = tb ? cpu::Blas::trans : cpu::Blas::no_trans;
    if constexpr (std::is_same_v<T, float>) {
      blas.sgemm(cpu::Blas::row_major, opa, opb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                 int(ldc));
    } else {
      blas.dgemm(cpu::Blas::row_major, opa, opb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                 int(ldc));
    }
    return;
  }
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ConstMap = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
  using MutMap = Eigen::Map<Mat, 0, Eigen::OuterStride<>>;
  MutMap C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) C.setZero(); else if (beta != T(1)) C *= beta;
  if (k == 0) return;
  ConstMap A(a, ta ? k : m, ta ? m : k, Eigen::OuterStride<>(lda));
  ConstMap B(b, tb ? n : k, tb ? k : n, Eigen::OuterStride<>(ldb));
  if (!ta && !tb) C.noalias() += alpha * A * B;
  else if (ta && !tb) C.noalias() += alpha * A.transpose() * B;
  else if (!ta && tb) C.noalias() += alpha * A * B.transpose();
  else C.noalias() += alpha * A.transpose() * B.transpose();
}
/// The shape of A B, after checking that A (..., M, K) and B (K, N) or (..., K, N) fit; C must
/// have it and be contiguous. The same rules on every device.
template <class T, class D>
Shape matmul_output_shape(const Tensor<T, D>& a, const Tensor<T, D>& b) {
  POLYSHARD_CHECK(a.rank() >= 2 && b.rank() >= 2, "matmul: operands need at least 2 dimensions, got ", a.shape(),
                  " and ", b.shape());
  POLYSHARD_CHECK(b.size(-2) == a.size(-1), "matmul: inner dimensions differ between ", a.shape(), " and ",
                  b.shape());
  const bool shared_b = b.rank() == 2;
  POLYSHARD_CHECK(shared_b || b.rank() == a.rank(), "matmul: batch ranks differ between ", a.shape(), " and ",
                  b.shape());
  Shape out;
  for (int i = 0; i < a.rank() - 2; ++i) {
    POLYSHARD_CHECK(shared_b || a.size(i) == b.size(i), "matmul: batch dimensions differ between ", a.shape(),
                    " and ", b.shape());
    out.push_back(a.size(i));
  }
  out.push_back(a.size(-2));
  out.push_back(b.size(-1));
  return out;
}
template <class T, class D>
void check_matmul_output(const Tensor<T, D>& a, const Tensor<T, D>& b, const Tensor<T, D>& c) {
  const Shape expected = matmul_output_shape(a, b);
  POLYSHARD_CHECK(c.shape() == expected, "matmul: output shape ", c.shape(), " does not match ", expected,
                  " for operands ", a.shape(), " and ", b.shape());
  POLYSHARD_CHECK(c.is_contiguous(), "matmul: output of shape ", c.shape(), " is not contiguous");
}

}  // namespace detail

/// C = alpha * A B + beta * C.
/// A: (..., M, K), B: (K, N) shared by every batch or (..., K, N) with A's batch shape,
/// C: (..., M, N) contiguous. A and B may be transposed views (Tensor::transpose()).
/// Only float and double: the 16-bit types are storage and are cast to float before a product.
template <Element T>
void matmul_into(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c, T alpha = T(1), T beta = T(0)) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "matmul on the CPU computes in float or double: cast half and bfloat16 tensors to float first");
  detail::check_matmul_output(a, b, c);
  const std::int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const bool shared_b = b.rank() == 2;

  Tensor<T> av = a, bv = b;
  // A view BLAS cannot take as it is (or an empty one) becomes a contiguous copy.
  auto layout = [](Tensor<T>& v, const Tensor<T>& src) {
    detail::MatrixLayout l{false, std::max<std::int64_t>(src.size(-1), 1)};
    if (detail::gemm_layout(v, l)) return l;
    v = src.contiguous();
    if (!detail::gemm_layout(v, l)) l = {false, std::max<std::int64_t>(src.size(-1), 1)};
    return l;
  };
  const detail::MatrixLayout la = layout(av, a), lb = layout(bv, b);
  const std::int64_t batch = a.shape().leading(2);

  // A contiguous (not transposed) A times a shared B is one tall GEMM over all batch rows.
  if (shared_b && !la.transposed && (batch == 1 || av.is_contiguous())) {
    detail::gemm_2d(false, lb.transposed, batch * m, n, k, alpha, av.data(), la.ld, bv.data(), lb.ld, beta, c.data(),
                    n);
    return;
  }
  // Otherwise one GEMM per batch element; batch offsets come from the strides of each operand.
  auto batch_offset = [](const Tensor<T>& t, std::int64_t flat) {
    std::int64_t off = 0;
    for (int i = t.rank() - 3; i >= 0; --i) {
      off += (flat % t.size(i)) * t.strides()[i];
      flat /= t.size(i);
    }
    return off;
  };
  for (std::int64_t i = 0; i < batch; ++i) {
    const T* pa = av.data() + batch_offset(av, i);
    const T* pb = shared_b ? bv.data() : bv.data() + batch_offset(bv, i);
    detail::gemm_2d(la.transposed, lb.transposed, m, n, k, alpha, pa, la.ld, pb, lb.ld, beta, c.data() + i * m * n,
                    n);
  }
}

/// A B as a new tensor (see matmul_into for the shapes).
template <Element T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b) {
  Tensor<T> c = Tensor<T>::empty(detail::matmul_output_shape(a, b));
  matmul_into(a, b, c);
  return c;
}

/// The float and double instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_MATMUL_INSTANCES(EXTERN, T) \
  EXTERN template void detail::gemm_2d<T>(bool, bool, std::int64_t, std::int64_t, std::int64_t, T, const T*, \
                                          std::int64_t, const T*, std::int64_t, T, T*, std::int64_t); \
  EXTERN template void matmul_into<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, T, T); \
  EXTERN template Tensor<T> matmul<T>(const Tensor<T>&, const Tensor<T>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_MATMUL_INSTANCES)

}  // namespace polyshard
