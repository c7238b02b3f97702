// Differentiable affine maps: linear(x, W, b) = x W^T + b, and batched matmul.
#pragma once

#include "polyshard/autograd/ops/accumulate.hpp"
#include "polyshard/tensor/ops/matmul.hpp"

namespace polyshard {

namespace detail {
/// Adds `bias` (N,) to every row of `y` (R, N).
template <class T>
void add_rows(const Tensor<T>& y, const Tensor<T>& bias) {
  const std::int64_t n = bias.numel(), rows = y.numel() / std::max<std::int64_t>(n, 1);
  T* py = y.data();
  const T* pb = bias.data();
  for (std::int64_t r = 0; r < rows; ++r, py += n)
    for (std::int64_t j = 0; j < n; ++j) py[j] += pb[j];
}

/// Sums the rows of `g` (R, N) into `out` (N,), adding when `accumulate`.
template <class T>
void sum_rows(const Tensor<T>& g, const Tensor<T>& out, bool accumulate) {
  const std::int64_t n = out.numel(), rows = g.numel() / std::max<std::int64_t>(n, 1);
  T* po = out.data();
  if (!accumulate) std::fill_n(po, n, T(0));
  const T* pg = g.data();
  for (std::int64_t r = 0; r < rows; ++r, pg += n)
    for (std::int64_t j = 0; j < n; ++j) po[j] += pg[j];
}
}  // namespace detail

/// y = x W^T (+ b).  x: (..., in), weight: (out, in) as PyTorch stores it, bias: (out,) or
/// undefined. Returns (..., out).
template <FloatElement T>
Var<T> linear(const Var<T>& x, const Var<T>& weight, const Var<T>& bias = Var<T>()) {
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  POLYSHARD_CHECK(ws.rank() == 2 && xs.rank() >= 1 && xs.back() == ws[1], "linear: input of shape ", xs,
                  " does not fit weight of shape ", ws, " (expected last input dimension ", ws.rank() == 2 ? ws[1] : -1,
                  ")");
  if (bias.defined())
    POLYSHARD_CHECK(bias.shape() == Shape{ws[0]}, "linear: bias of shape ", bias.shape(),
                    " does not fit weight of shape ", ws);
  const Tensor<T> x2 = x.value().contiguous().reshape({-1, ws[1]});  // (R, in)
  Shape ys = xs;
  ys[ys.rank() - 1] = ws[0];
  Tensor<T> y = Tensor<T>::empty(ys);  // (..., out)
  matmul_into(x2, weight.value().transpose(), y.reshape({-1, ws[0]}));
  if (bias.defined()) detail::add_rows(y, bias.value());

  auto backward = [x2, has_bias = bias.defined()](Node<T>& self) {
    const Tensor<T>& w = self.inputs[1]->value;                         // (out, in)
    const Tensor<T> dy = self.grad.reshape({-1, w.size(0)});             // (R, out)
    if (GradSink<T> dx = self.inputs[0]->sink(); dx.wanted())            // (R, in) = dy W
      matmul_into(dy, w, dx.tensor.reshape({-1, w.size(1)}), T(1), dx.accumulate ? T(1) : T(0));
    if (GradSink<T> dw = self.inputs[1]->sink(); dw.wanted())            // (out, in) = dy^T x
      matmul_into(dy.transpose(), x2, dw.tensor, T(1), dw.accumulate ? T(1) : T(0));
    if (has_bias)
      if (GradSink<T> db = self.inputs[2]->sink(); db.wanted()) detail::sum_rows(dy, db.tensor, db.accumulate);
  };
  if (bias.defined()) return make_result(std::move(y), "linear", {x, weight, bias}, std::move(backward));
  return make_result(std::move(y), "linear", {x, weight}, std::move(backward));
}

/// Batched product a b over the last two dimensions. a: (..., M, K); b: (K, N) shared by the
/// batch, or (..., K, N). Returns (..., M, N).
template <FloatElement T>
Var<T> matmul(const Var<T>& a, const Var<T>& b) {
  Tensor<T> y = matmul(a.value(), b.value());
  return make_result(std::move(y), "matmul", {a, b}, [](Node<T>& self) {
    const Tensor<T>& av = self.inputs[0]->value;
    const Tensor<T>& bv = self.inputs[1]->value;
    const Tensor<T>& dy = self.grad;  // (..., M, N)
    if (GradSink<T> da = self.inputs[0]->sink(); da.wanted())  // (..., M, K) = dy b^T
      matmul_into(dy, bv.transpose(), da.tensor, T(1), da.accumulate ? T(1) : T(0));
    if (GradSink<T> db = self.inputs[1]->sink(); db.wanted()) {
      if (bv.rank() == 2) {  // (K, N) = sum over the batch of a^T dy
        const Tensor<T> a2 = av.contiguous().reshape({-1, av.size(-1)});
        matmul_into(a2.transpose(), dy.reshape({-1, dy.size(-1)}), db.tensor, T(1), db.accumulate ? T(1) : T(0));
      } else {               // (..., K, N) = a^T dy per batch element
        matmul_into(av.transpose(), dy, db.tensor, T(1), db.accumulate ? T(1) : T(0));
      }
    }
  });
}

}  // namespace polyshard
