// Differentiable affine maps: linear(x, W, b) = x W^T + b, and batched matmul.
#pragma once

#include "polyshard/autograd/ops/accumulate.hpp"
#include "polyshard/tensor/ops/matmul.hpp"

namespace polyshard {

namespace detail {
/// Adds `bias` (N,) to every row of `y` (R, N).
template <class T>
void add_rows(const Tensor<T, Cpu>& y, const Tensor<T, Cpu>& bias) {
  const std::int64_t n = bias.numel(), rows = y.numel() / std::max<std::int64_t>(n, 1);
  T* py = y.data();
  const T* pb = bias.data();
  for (std::int64_t r = 0; r < rows; ++r, py += n)
    for (std::int64_t j = 0; j < n; ++j) py[j] += pb[j];
}

/// Sums the rows of `g` (R, N) into `out` (N,), adding when `accumulate`.
template <class T>
void sum_rows(const Tensor<T, Cpu>& g, const Tensor<T, Cpu>& out, bool accumulate) {
  const std::int64_t n = out.numel(), rows = g.numel() / std::max<std::int64_t>(n, 1);
  T* po = out.data();
  if (!accumulate) std::fill_n(po, n, T(0));
  const T* pg = g.data();
  for (std::int64_t r = 0; r < rows; ++r, pg += n)
    for (std::int64_t j = 0; j < n; ++j) po[j] += pg[j];
}
/// alpha and beta as the device's matmul_into takes them: T on the host, float on a GPU.
template <class T, class D>
auto gemm_scalar(int v) {  // 1 for alpha; 0 or 1 (accumulate) for beta
  if constexpr (std::same_as<D, Cpu>) return T(v);
  else return float(v);
}

/// The device's twins of add_rows and sum_rows: a bias kernel and a two-stage column sum.
template <class T>
void add_rows(const Tensor<T, Cuda>& y, const Tensor<T, Cuda>& bias) {
  add_bias_into(y, bias);
}
template <class T>
void sum_rows(const Tensor<T, Cuda>& g, const Tensor<T, Cuda>& out, bool accumulate) {
  column_sum(g, GradOut<T, Cuda>{out, accumulate});
}
}  // namespace detail

/// y = x W^T (+ b).  x: (..., in), weight: (out, in) as PyTorch stores it, bias: (out,) or
/// undefined. Returns (..., out).
template <FloatElement T, Device D>
Var<T, D> linear(const Var<T, D>& x, const Var<T, D>& weight, const Var<T, D>& bias = Var<T, D>()) {
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  POLYSHARD_CHECK(ws.rank() == 2 && xs.rank() >= 1 && xs.back() == ws[1], "linear: input of shape ", xs,
                  " does not fit weight of shape ", ws, " (expected last input dimension ", ws.rank() == 2 ? ws[1] : -1,
                  ")");
  if (bias.defined())
    POLYSHARD_CHECK(bias.shape() == Shape{ws[0]}, "linear: bias of shape ", bias.shape(),
                    " does not fit weight of shape ", ws);
  const Tensor<T, D> x2 = x.value().contiguous().reshape({-1, ws[1]});  // (R, in)
  Shape ys = xs;
  ys[ys.rank() - 1] = ws[0];
  Tensor<T, D> y = Tensor<T, D>::empty(ys);  // (..., out)
  matmul_into(x2, weight.value().transpose(), y.reshape({-1, ws[0]}));
  if (bias.defined()) detail::add_rows(y, bias.value());

  auto backward = [x2, has_bias = bias.defined()](Node<T, D>& self) {
    const auto one = detail::gemm_scalar<T, D>(1);
    const auto beta = [](bool accumulate) { return detail::gemm_scalar<T, D>(accumulate); };
    const Tensor<T, D>& w = self.inputs[1]->value;                         // (out, in)
    const Tensor<T, D> dy = self.grad.reshape({-1, w.size(0)});             // (R, out)
    if (GradSink<T, D> dx = self.inputs[0]->sink(); dx.wanted())            // (R, in) = dy W
      matmul_into(dy, w, dx.tensor.reshape({-1, w.size(1)}), one, beta(dx.accumulate));
    if (GradSink<T, D> dw = self.inputs[1]->sink(); dw.wanted())            // (out, in) = dy^T x
      matmul_into(dy.transpose(), x2, dw.tensor, one, beta(dw.accumulate));
    if (has_bias)
      if (GradSink<T, D> db = self.inputs[2]->sink(); db.wanted()) detail::sum_rows(dy, db.tensor, db.accumulate);
  };
  if (bias.defined()) return make_result(std::move(y), "linear", {x, weight, bias}, std::move(backward));
  return make_result(std::move(y), "linear", {x, weight}, std::move(backward));
}

/// Batched product a b over the last two dimensions. a: (..., M, K); b: (K, N) shared by the
/// batch, or (..., K, N). Returns (..., M, N).
template <FloatElement T, Device D>
Var<T, D> matmul(const Var<T, D>& a, const Var<T, D>& b) {
  Tensor<T, D> y = matmul(a.value(), b.value());
  return make_result(std::move(y), "matmul", {a, b}, [](Node<T, D>& self) {
    const auto one = detail::gemm_scalar<T, D>(1);
    const auto beta = [](bool accumulate) { return detail::gemm_scalar<T, D>(accumulate); };
    const Tensor<T, D>& av = self.inputs[0]->value;
    const Tensor<T, D>& bv = self.inputs[1]->value;
    const Tensor<T, D>& dy = self.grad;  // (..., M, N)
    if (GradSink<T, D> da = self.inputs[0]->sink(); da.wanted())  // (..., M, K) = dy b^T
      matmul_into(dy, bv.transpose(), da.tensor, one, beta(da.accumulate));
    if (GradSink<T, D> db = self.inputs[1]->sink(); db.wanted()) {
      if (bv.rank() == 2) {  // (K, N) = sum over the batch of a^T dy
        const Tensor<T, D> a2 = av.contiguous().reshape({-1, av.size(-1)});
        matmul_into(a2.transpose(), dy.reshape({-1, dy.size(-1)}), db.tensor, one, beta(db.accumulate));
      } else {               // (..., K, N) = a^T dy per batch element
        matmul_into(av.transpose(), dy, db.tensor, one, beta(db.accumulate));
      }
    }
  });
}

}  // namespace polyshard
