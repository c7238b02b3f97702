// The tensor ops on Tensor<T, Cuda>: the same names and arguments as the CPU ops in
// tensor/ops/, checked the same way, run as CUDA kernels on the thread's current stream.
// Element types: float, half and bfloat16; 16-bit tensors compute in float inside the kernels,
// and per-row statistics (layer-norm mean and rstd, cross-entropy losses and lse) are float.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "polyshard/core/cuda/current_stream.hpp"
#include "polyshard/core/env_flag.hpp"
#include "polyshard/engine/cuda/unit_kernels.hpp"
#include "polyshard/tensor/cuda/flash_attention.hpp"
#include "polyshard/tensor/cuda/matmul.hpp"
#include "polyshard/tensor/cuda/storage.hpp"
#include "polyshard/tensor/cuda/transformer_kernels.hpp"
#include "polyshard/tensor/ops/cross_entropy.hpp"  // detail::row_shape
#include "polyshard/tensor/ops/embedding.hpp"      // detail::check_embedding_backward
#include "polyshard/tensor/ops/grad_out.hpp"
#include "polyshard/tensor/ops/linear.hpp"  // detail::check_linear
#include "polyshard/tensor/ops/matmul.hpp"
#include "polyshard/tensor/ops/grouped_qkv.hpp"  // detail::grouped_qkv_dims
#include "polyshard/tensor/ops/layer_norm.hpp"   // detail::check_layer_norm_forward, _backward
#include "polyshard/tensor/ops/rms_norm.hpp"     // detail::check_rms_norm_backward
#include "polyshard/tensor/ops/rope.hpp"         // detail::check_rope
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// An element type the CUDA kernels are built for.
template <class T>
concept CudaFloatElement = std::same_as<T, float> || std::same_as<T, half> || std::same_as<T, bfloat16>;
/// The 16-bit elements, those that the fused attention kernels are compiled for.
template <class T>
concept Cuda16BitElement = std::same_as<T, half> || std::same_as<T, bfloat16>;

namespace detail::cuda_ops {
template <class T>
cuda::DeviceGradOut<T> device_grad(const GradOut<T, Cuda>& g) {
  return {g.wanted() ? g.tensor.data() : nullptr, g.accumulate};
}
template <class T>
const T* input(const char* op, const char* what, const Tensor<T, Cuda>& t) {
  POLYSHARD_CHECK(t.defined(), op, ": input ", what, " is undefined");
  POLYSHARD_CHECK(t.is_contiguous(), op, ": input ", what, " of shape ", t.shape(),
                  " is not contiguous (call contiguous() first)");
  return t.data();
}
/// Scratch for one kernel: device memory from the pool, freed in stream order after it.
inline Tensor<float, Cuda> scratch_floats(std::size_t n) {
  return Tensor<float, Cuda>::empty(Shape{static_cast<std::int64_t>(n)}, MemoryCategory::Activations);
}
}  // namespace detail::cuda_ops

/// out = static_cast<To>(x), rounded to nearest even. x, out: same shape, contiguous.
template <Element To, Element From>
void cast_into(const Tensor<From, Cuda>& x, const Tensor<To, Cuda>& out) {
  detail::check_output("cast", "out", out, x.shape());
  cuda::cast_span(detail::cuda_ops::input("cast", "x", x), out.data(), static_cast<std::size_t>(x.numel()),
                  cuda::current_stream());
}
template <Element To, Element From>
Tensor<To, Cuda> cast(const Tensor<From, Cuda>& x, MemoryCategory category = current_memory_category()) {
  auto out = Tensor<To, Cuda>::empty(x.shape(), category);
  cast_into(x, out);
  return out;
}

/// out = a + b. a, b, out: same shape.
template <CudaFloatElement T>
void add_into(const Tensor<T, Cuda>& a, const Tensor<T, Cuda>& b, const Tensor<T, Cuda>& out) {
  check_same_shape("add", a.shape(), b.shape());
  detail::check_output("add", "out", out, a.shape());
  cuda::add_into(detail::cuda_ops::input("add", "a", a), detail::cuda_ops::input("add", "b", b), out.data(),
                 a.numel(), cuda::current_stream());
}
template <CudaFloatElement T>
Tensor<T, Cuda> add(const Tensor<T, Cuda>& a, const Tensor<T, Cuda>& b) {
  auto out = Tensor<T, Cuda>::empty(a.shape());
  add_into(a, b, out);
  return out;
}
/// y += x (a residual branch or a second gradient contribution). x, y: same shape.
template <CudaFloatElement T>
void accumulate_into(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& y) {
  detail::check_output("accumulate", "y", y, x.shape());
  cuda::add_into_accumulate(detail::cuda_ops::input("accumulate", "x", x), y.data(), x.numel(), cuda::current_stream());
}
/// out = s * x.
template <CudaFloatElement T>
void scale_into(const Tensor<T, Cuda>& x, double s, const Tensor<T, Cuda>& out) {
  detail::check_output("scale", "out", out, x.shape());
  cuda::scale_into(detail::cuda_ops::input("scale", "x", x), s, out.data(), x.numel(), cuda::current_stream());
}
template <CudaFloatElement T>
Tensor<T, Cuda> scale(const Tensor<T, Cuda>& x, double s) {
  auto out = Tensor<T, Cuda>::empty(x.shape());
  scale_into(x, s, out);
  return out;
}

/// out = a * b. a, b, out: same shape.
template <CudaFloatElement T>
void mul_into(const Tensor<T, Cuda>& a, const Tensor<T, Cuda>& b, const Tensor<T, Cuda>& out) {
  check_same_shape("mul", a.shape(), b.shape());
  detail::check_output("mul", "out", out, a.shape());
  cuda::mul_into(detail::cuda_ops::input("mul", "a", a), detail::cuda_ops::input("mul", "b", b), out.data(),
                 a.numel(), cuda::current_stream());
}
template <CudaFloatElement T>
Tensor<T, Cuda> mul(const Tensor<T, Cuda>& a, const Tensor<T, Cuda>& b) {
  auto out = Tensor<T, Cuda>::empty(a.shape());
  mul_into(a, b, out);
  return out;
}
/// y += s * x. x, y: same shape.
template <CudaFloatElement T>
void add_scaled_into(const Tensor<T, Cuda>& x, double s, const Tensor<T, Cuda>& y) {
  detail::check_output("add_scaled", "y", y, x.shape());
  cuda::add_scaled_into(detail::cuda_ops::input("add_scaled", "x", x), s, y.data(), x.numel(), cuda::current_stream());
}
/// y[..., c] += bias[c]: a bias broadcast over every row. y: (..., C); bias: (C,).
template <CudaFloatElement T>
void add_bias_into(const Tensor<T, Cuda>& y, const Tensor<T, Cuda>& bias) {
  POLYSHARD_CHECK(y.rank() >= 1 && bias.shape() == Shape{y.size(-1)}, "add_bias: bias of shape ", bias.shape(),
                  " does not fit rows of shape ", y.shape());
  detail::check_output("add_bias", "y", y, y.shape());
  cuda::add_bias_rows(y.data(), detail::cuda_ops::input("add_bias", "bias", bias), y.shape().leading(1), y.size(-1),
                      cuda::current_stream());
}
/// The sum of every element, added in double in a fixed order; waits for it.
template <CudaFloatElement T>
double sum(const Tensor<T, Cuda>& x) {
  const auto workspace = Tensor<double, Cuda>::empty(
      Shape{static_cast<std::int64_t>(cuda::sum_workspace_doubles()) + 1}, MemoryCategory::Activations);
  cuda::sum(detail::cuda_ops::input("sum", "x", x), x.numel(), workspace.data(), workspace.data() + 1,
            cuda::current_stream());
  double total = 0;
  Storage<double, Cuda>::copy_to_host(&total, workspace.data(), 1);
  return total;
}
template <CudaFloatElement T>
double mean(const Tensor<T, Cuda>& x) {
  POLYSHARD_CHECK(x.numel() > 0, "mean: empty tensor of shape ", x.shape());
  return sum(x) / double(x.numel());
}

/// y = GELU(x), the tanh approximation. x, y: same shape.
template <CudaFloatElement T>
void gelu_forward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& y) {
  detail::check_output("gelu", "y", y, x.shape());
  cuda::gelu_forward(detail::cuda_ops::input("gelu", "x", x), y.data(), x.numel(), cuda::current_stream());
}
template <CudaFloatElement T>
void gelu_backward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& dy, const GradOut<T, Cuda>& dx) {
  check_same_shape("gelu backward", x.shape(), dy.shape());
  if (!dx.wanted()) return;
  detail::check_output("gelu backward", "dx", dx.tensor, x.shape());
  cuda::gelu_backward(detail::cuda_ops::input("gelu backward", "x", x),
                      detail::cuda_ops::input("gelu backward", "dy", dy), detail::cuda_ops::device_grad(dx), x.numel(),
                      cuda::current_stream());
}

/// Layer normalization over the last dimension. x, y: (..., C); weight, bias: (C,);
/// mean, rstd: (...) in float, saved for the backward pass.
template <CudaFloatElement T>
void layer_norm_forward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& weight, const Tensor<T, Cuda>& bias,
                        double eps, const Tensor<T, Cuda>& y, const Tensor<float, Cuda>& mean,
                        const Tensor<float, Cuda>& rstd) {
  detail::check_layer_norm_forward(x, weight, bias, y, mean, rstd);
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  using detail::cuda_ops::input;
  cuda::layer_norm_forward(input("layer_norm", "x", x), input("layer_norm", "weight", weight),
                           input("layer_norm", "bias", bias), static_cast<float>(eps), y.data(), mean.data(),
                           rstd.data(), rows, c, cuda::current_stream());
}
template <CudaFloatElement T>
void layer_norm_backward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& weight, const Tensor<float, Cuda>& mean,
                         const Tensor<float, Cuda>& rstd, const Tensor<T, Cuda>& dy, const GradOut<T, Cuda>& dx,
                         const GradOut<T, Cuda>& dweight, const GradOut<T, Cuda>& dbias) {
  detail::check_layer_norm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias);
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  const std::size_t floats = cuda::layer_norm_backward_workspace_floats(rows, c);
  const auto workspace = detail::cuda_ops::scratch_floats(floats);
  using detail::cuda_ops::device_grad;
  using detail::cuda_ops::input;
  cuda::layer_norm_backward(input("layer_norm backward", "x", x), input("layer_norm backward", "weight", weight),
                            input("layer_norm backward", "mean", mean), input("layer_norm backward", "rstd", rstd),
                            input("layer_norm backward", "dy", dy), device_grad(dx), device_grad(dweight),
                            device_grad(dbias), rows, c, workspace.data(), floats, cuda::current_stream());
}

/// RMS normalization over the last dimension (torch.nn.RMSNorm). x, y: (..., C); weight: (C,);
/// rstd: (...) in float, saved for the backward pass.
template <CudaFloatElement T>
void rms_norm_forward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& weight, double eps, const Tensor<T, Cuda>& y,
                      const Tensor<float, Cuda>& rstd) {
  POLYSHARD_CHECK(x.rank() >= 1, "rms_norm: input needs at least 1 dimension, got shape ", x.shape());
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  POLYSHARD_CHECK(weight.shape() == Shape{c}, "rms_norm: weight of shape ", weight.shape(),
                  " does not fit input of shape ", x.shape());
  detail::check_output("rms_norm", "y", y, x.shape());
  detail::check_output("rms_norm", "rstd", rstd, detail::row_shape(x.shape()));
  using detail::cuda_ops::input;
  cuda::rms_norm_forward(input("rms_norm", "x", x), input("rms_norm", "weight", weight), static_cast<float>(eps),
                         y.data(), rstd.data(), rows, c, cuda::current_stream());
}
template <CudaFloatElement T>
void rms_norm_backward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& weight, const Tensor<float, Cuda>& rstd,
                       const Tensor<T, Cuda>& dy, const GradOut<T, Cuda>& dx, const GradOut<T, Cuda>& dweight) {
  detail::check_rms_norm_backward(x, weight, rstd, dy, dx, dweight);
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  const std::size_t floats = dweight.wanted() ? cuda::rms_norm_backward_workspace_floats(rows, c) : 0;
  const auto workspace = detail::cuda_ops::scratch_floats(floats);
  using detail::cuda_ops::device_grad;
  using detail::cuda_ops::input;
  cuda::rms_norm_backward(input("rms_norm backward", "x", x), input("rms_norm backward", "weight", weight),
                          input("rms_norm backward", "rstd", rstd), input("rms_norm backward", "dy", dy),
                          device_grad(dx), device_grad(dweight), rows, c, workspace.data(), floats,
                          cuda::current_stream());
}

/// Grouped-query key-value sharing (see the CPU grouped_qkv_forward). q: (B, T, n_head head_dim);
/// k, v: (B, T, n_kv_head head_dim); qkv: (B, T, 3 n_head head_dim).
template <CudaFloatElement T>
void grouped_qkv_forward(const Tensor<T, Cuda>& q, const Tensor<T, Cuda>& k, const Tensor<T, Cuda>& v, int n_head,
                         int n_kv_head, const Tensor<T, Cuda>& qkv) {
  const auto d = detail::grouped_qkv_dims("grouped_qkv", q, k, v, n_head, n_kv_head);
  detail::check_output("grouped_qkv", "qkv", qkv, Shape{d.b, d.t, 3 * d.n_head * d.head_dim});
  using detail::cuda_ops::input;
  cuda::grouped_qkv_forward(input("grouped_qkv", "q", q), input("grouped_qkv", "k", k), input("grouped_qkv", "v", v),
                            qkv.data(), d.b * d.t, d.head_dim, d.n_head, d.n_kv_head, cuda::current_stream());
}
template <CudaFloatElement T>
void grouped_qkv_backward(const Tensor<T, Cuda>& dqkv, int n_head, int n_kv_head, const GradOut<T, Cuda>& dq,
                          const GradOut<T, Cuda>& dk, const GradOut<T, Cuda>& dv) {
  const auto d = detail::check_grouped_qkv_backward(dqkv, n_head, n_kv_head, dq, dk, dv);
  using detail::cuda_ops::device_grad;
  cuda::grouped_qkv_backward(detail::cuda_ops::input("grouped_qkv backward", "dqkv", dqkv), device_grad(dq),
                             device_grad(dk), device_grad(dv), d.b * d.t, d.head_dim, n_head, n_kv_head,
                             cuda::current_stream());
}

/// Rotary position embedding (see the CPU rope_forward). x, y: (B, T, H, head_dim).
template <CudaFloatElement T>
void rope_forward(const Tensor<T, Cuda>& x, double theta, std::int64_t offset, const Tensor<T, Cuda>& y) {
  detail::check_rope("rope", x, theta, offset);
  detail::check_output("rope", "y", y, x.shape());
  cuda::rope_rotate(detail::cuda_ops::input("rope", "x", x), cuda::DeviceGradOut<T>{y.data(), false}, x.size(0),
                    x.size(1), x.size(2), x.size(3), theta, offset, false, cuda::current_stream());
}
template <CudaFloatElement T>
void rope_backward(const Tensor<T, Cuda>& dy, double theta, std::int64_t offset, const GradOut<T, Cuda>& dx) {
  detail::check_rope("rope backward", dy, theta, offset);
  if (!dx.wanted()) return;
  detail::check_output("rope backward", "dx", dx.tensor, dy.shape());
  cuda::rope_rotate(detail::cuda_ops::input("rope backward", "dy", dy), detail::cuda_ops::device_grad(dx), dy.size(0),
                    dy.size(1), dy.size(2), dy.size(3), theta, offset, true, cuda::current_stream());
}

/// y = x sigmoid(x). x, y: same shape.
template <CudaFloatElement T>
void silu_forward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& y) {
  detail::check_output("silu", "y", y, x.shape());
  cuda::silu_forward(detail::cuda_ops::input("silu", "x", x), y.data(), x.numel(), cuda::current_stream());
}
template <CudaFloatElement T>
void silu_backward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& dy, const GradOut<T, Cuda>& dx) {
  check_same_shape("silu backward", x.shape(), dy.shape());
  if (!dx.wanted()) return;
  detail::check_output("silu backward", "dx", dx.tensor, x.shape());
  cuda::silu_backward(detail::cuda_ops::input("silu backward", "x", x),
                      detail::cuda_ops::input("silu backward", "dy", dy), detail::cuda_ops::device_grad(dx), x.numel(),
                      cuda::current_stream());
}

/// Softmax over the last dimension. x, y: (..., N).
template <CudaFloatElement T>
void softmax_forward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& y) {
  POLYSHARD_CHECK(x.rank() >= 1 && x.size(-1) > 0, "softmax: input needs a non-empty last dimension, got shape ",
                  x.shape());
  detail::check_output("softmax", "y", y, x.shape());
  const T* in = detail::cuda_ops::input("softmax", "x", x);  // its checks before any output is touched
  cuda::softmax_forward(in, y.data(), x.shape().leading(1), x.size(-1), cuda::current_stream());
}
template <CudaFloatElement T>
void softmax_backward(const Tensor<T, Cuda>& y, const Tensor<T, Cuda>& dy, const GradOut<T, Cuda>& dx) {
  check_same_shape("softmax backward", y.shape(), dy.shape());
  if (!dx.wanted()) return;
  detail::check_output("softmax backward", "dx", dx.tensor, y.shape());
  const T* in_y = detail::cuda_ops::input("softmax backward", "y", y);
  const T* in_dy = detail::cuda_ops::input("softmax backward", "dy", dy);
  cuda::softmax_backward(in_y, in_dy, detail::cuda_ops::device_grad(dx), y.shape().leading(1), y.size(-1),
                         cuda::current_stream());
}

/// Rows of `table` picked by `ids`. ids: (...); table: (V, C); out: (..., C).
template <CudaFloatElement T>
void embedding_forward(const Tensor<std::int32_t, Cuda>& ids, const Tensor<T, Cuda>& table,
                       const Tensor<T, Cuda>& out) {
  POLYSHARD_CHECK(table.rank() == 2, "embedding: table must be (V, C), got shape ", table.shape());
  Shape out_shape = ids.shape();
  out_shape.push_back(table.size(1));
  detail::check_output("embedding", "out", out, out_shape);
  cuda::embedding_forward(detail::cuda_ops::input("embedding", "ids", ids),
                          detail::cuda_ops::input("embedding", "table", table), out.data(), ids.numel(),
                          table.size(0), table.size(1), cuda::current_stream());
}
/// dtable (+)= the rows of dout summed per id, deterministically (sorted by id, then position).
template <CudaFloatElement T>
void embedding_backward(const Tensor<std::int32_t, Cuda>& ids, const Tensor<T, Cuda>& dout,
                        const GradOut<T, Cuda>& dtable) {
  if (!dtable.wanted()) return;
  detail::check_embedding_backward(ids, dout, dtable.tensor);
  const std::int64_t v = dtable.tensor.size(0), c = dtable.tensor.size(1);
  const std::size_t bytes = cuda::embedding_backward_workspace_bytes(ids.numel(), v);
  const auto workspace = detail::cuda_ops::scratch_floats((bytes + sizeof(float) - 1) / sizeof(float));
  cuda::embedding_backward(detail::cuda_ops::input("embedding backward", "ids", ids),
                           detail::cuda_ops::input("embedding backward", "dout", dout),
                           detail::cuda_ops::device_grad(dtable), ids.numel(), v, c, workspace.data(),
                           workspace.bytes(), cuda::current_stream());
}

/// losses[i] = logsumexp(logits[i, :]) - logits[i, targets[i]]. logits: (..., V);
/// targets: (...); losses, lse: (...) in float (lse saved for the backward pass).
template <CudaFloatElement T>
void cross_entropy_forward(const Tensor<T, Cuda>& logits, const Tensor<std::int32_t, Cuda>& targets,
                           const Tensor<float, Cuda>& losses, const Tensor<float, Cuda>& lse) {
  POLYSHARD_CHECK(logits.rank() >= 1 && logits.size(-1) > 0,
                  "cross_entropy: logits need a non-empty last dimension, got shape ", logits.shape());
  const Shape rows = detail::row_shape(logits.shape());
  check_same_shape("cross_entropy targets", targets.shape(), rows);
  detail::check_output("cross_entropy", "losses", losses, rows);
  detail::check_output("cross_entropy", "lse", lse, rows);
  cuda::cross_entropy_forward(detail::cuda_ops::input("cross_entropy", "logits", logits),
                              detail::cuda_ops::input("cross_entropy", "targets", targets), losses.data(), lse.data(),
                              rows.numel(), logits.size(-1), cuda::current_stream());
}
/// dlogits[i, :] (+)= dlosses[i] (softmax(logits[i, :]) - onehot(targets[i])).
template <CudaFloatElement T>
void cross_entropy_backward(const Tensor<T, Cuda>& logits, const Tensor<std::int32_t, Cuda>& targets,
                            const Tensor<float, Cuda>& lse, const Tensor<float, Cuda>& dlosses,
                            const GradOut<T, Cuda>& dlogits) {
  if (!dlogits.wanted()) return;
  const Shape rows = detail::row_shape(logits.shape());
  check_same_shape("cross_entropy backward targets", targets.shape(), rows);
  check_same_shape("cross_entropy backward lse", lse.shape(), rows);
  check_same_shape("cross_entropy backward dlosses", dlosses.shape(), rows);
  detail::check_output("cross_entropy backward", "dlogits", dlogits.tensor, logits.shape());
  using detail::cuda_ops::input;
  cuda::cross_entropy_backward(input("cross_entropy backward", "logits", logits),
                               input("cross_entropy backward", "targets", targets),
                               input("cross_entropy backward", "lse", lse),
                               input("cross_entropy backward", "dlosses", dlosses), 1.0f,
                               detail::cuda_ops::device_grad(dlogits), rows.numel(), logits.size(-1),
                               cuda::current_stream());
}
/// The head's weight (V, C) as linear_cross_entropy's products read it: itself when V is a
/// multiple of 64, else a copy with padded_vocab(V) - V rows of zeros after its own. Every
/// product over the vocabulary then has that dimension a multiple of 64: for an odd one (GPT-2's
/// 50257) cuBLASLt picks align1 kernels, 5 to 8 times slower, even over aligned rows.
template <CudaFloatElement T>
Tensor<T, Cuda> padded_head_weight(const Tensor<T, Cuda>& weight) {
  POLYSHARD_CHECK(weight.rank() == 2 && weight.size(0) > 0, "linear_cross_entropy: head weight of shape ",
                  weight.shape(), " is not (V, C)");
  const std::int64_t v = weight.size(0), c = weight.size(1), ld = padded_vocab(v);
  const T* w = detail::cuda_ops::input("linear_cross_entropy", "weight", weight);
  if (ld == v) return weight;
  auto padded = Tensor<T, Cuda>::empty(Shape{ld, c}, MemoryCategory::Activations);
  const cudaStream_t stream = cuda::current_stream();
  POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(padded.data(), w, std::size_t(v * c) * sizeof(T), cudaMemcpyDeviceToDevice,
                                       stream));
  POLYSHARD_CUDA_CHECK(cudaMemsetAsync(padded.data() + v * c, 0, std::size_t((ld - v) * c) * sizeof(T), stream));
  return padded;
}

/// The head of a language model and its loss: logits = x head_weight^T into `logits` (R,
/// padded_vocab(V)), whose columns past V come out zero (head_weight: padded_head_weight of the
/// weight), then each row's loss and log-sum-exp over the first V columns, and their mean into
/// `loss`, a scalar left on the device. x: (R, C); targets: (R,); lse: (R,) float, or undefined.
/// With `gradient_in_place`, the same pass over the logits also overwrites them with the rows'
/// unscaled loss gradient, softmax - onehot (the padding's zeros kept), which is all the backward
/// needs: one pass over the largest activation instead of two (see logits_gradient_in_place).
template <CudaFloatElement T>
void linear_cross_entropy_forward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& head_weight, std::int64_t v,
                                  const Tensor<std::int32_t, Cuda>& targets, const Tensor<T, Cuda>& logits,
                                  const Tensor<float, Cuda>& lse, const Tensor<T, Cuda>& loss,
                                  bool gradient_in_place = false) {
  const char* op = "linear_cross_entropy";
  using detail::cuda_ops::input;
  const std::int64_t ld = padded_vocab(v);
  POLYSHARD_CHECK(x.rank() == 2 && head_weight.rank() == 2 && x.size(1) == head_weight.size(1) && v > 0 &&
                      head_weight.size(0) == ld,
                  op, ": input of shape ", x.shape(), " does not fit a head weight of shape ", head_weight.shape(),
                  " padded from ", v, " rows");
  const std::int64_t rows = x.size(0);
  POLYSHARD_CHECK(rows > 0, op, ": no positions in input of shape ", x.shape());
  check_same_shape("linear_cross_entropy targets", targets.shape(), Shape{rows});
  detail::check_output(op, "logits", logits, Shape{rows, ld});
  if (lse.defined()) detail::check_output(op, "lse", lse, Shape{rows});
  detail::check_output(op, "loss", loss, Shape{});
  const cudaStream_t stream = cuda::current_stream();
  cuda::MatmulArgs<T> p;  // (R, ld) = x (R, C) times head_weight^T, stored (ld, C)
  p.m = rows, p.n = ld, p.k = x.size(1);
  p.a = input(op, "x", x);
  p.b = input(op, "weight", head_weight), p.trans_b = true;
  p.c = logits.data();
  cuda::matmul(p, stream);
  auto losses = Tensor<float, Cuda>::empty(Shape{rows}, MemoryCategory::Activations);
  float* lse_out = lse.defined() ? lse.data() : nullptr;
  if (gradient_in_place)
    cuda::cross_entropy_rows_fused(logits.data(), ld, input(op, "targets", targets), losses.data(), lse_out, 1.0f,
                                   cuda::DeviceGradOut<T>{logits.data(), false}, rows, v, stream);
  else
    cuda::cross_entropy_rows_forward(logits.data(), ld, input(op, "targets", targets), losses.data(), lse_out, rows, v,
                                     stream);
  cuda::mean_of_losses(losses.data(), rows, loss.data(), stream);
}

/// The gradients of linear_cross_entropy_forward's mean loss, times dloss (a scalar on the
/// device, read there) and dloss_factor. Unless the forward left the unscaled gradient in the
/// logits (`gradient_in_place`), the logits first become their gradient in place, scaled by
/// dloss * dloss_factor / R (lse needed). Then dx = dlogits head_weight and dweight (V, C) = the
/// first V rows of dlogits^T x, written or added to; from an unscaled gradient, the products
/// take 1 / R as alpha and their outputs are scaled by dloss * dloss_factor on the device.
template <CudaFloatElement T>
void linear_cross_entropy_backward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& head_weight, std::int64_t v,
                                   const Tensor<std::int32_t, Cuda>& targets, const Tensor<T, Cuda>& logits,
                                   const Tensor<float, Cuda>& lse, const Tensor<T, Cuda>& dloss, double dloss_factor,
                                   const GradOut<T, Cuda>& dx, const GradOut<T, Cuda>& dweight,
                                   bool gradient_in_place = false) {
  const char* op = "linear_cross_entropy backward";
  using detail::cuda_ops::input;
  const std::int64_t rows = x.size(0), c = x.size(1), ld = padded_vocab(v);
  check_same_shape("linear_cross_entropy backward head weight", head_weight.shape(), Shape{ld, c});
  detail::check_output(op, "logits", logits, Shape{rows, ld});
  check_same_shape("linear_cross_entropy backward dloss", dloss.shape(), Shape{});
  const cudaStream_t stream = cuda::current_stream();
  if (!gradient_in_place) {
    check_same_shape("linear_cross_entropy backward lse", lse.shape(), Shape{rows});
    cuda::cross_entropy_rows_backward(logits.data(), ld, input(op, "targets", targets), input(op, "lse", lse), nullptr,
                                      static_cast<float>(dloss_factor / double(rows)), input(op, "dloss", dloss),
                                      cuda::DeviceGradOut<T>{logits.data(), false}, rows, v, stream);
  }
  // One product into `out` (its first out.numel() elements of C, when C is scratch): with a
  // scaled gradient, straight in with beta; from an unscaled one, alpha = 1 / R and then the
  // device scale, into scratch unless the product may overwrite `out` and be scaled in place.
  const auto product_into = [&](cuda::MatmulArgs<T> p, const GradOut<T, Cuda>& out, bool fits) {
    Tensor<T, Cuda> scratch;
    const bool direct = fits && (!gradient_in_place || !out.accumulate);
    if (direct) {
      p.c = out.tensor.data();
      p.beta = !gradient_in_place && out.accumulate ? 1.0f : 0.0f;
    } else {
      scratch = Tensor<T, Cuda>::empty(Shape{p.m, p.n}, MemoryCategory::Activations);
      p.c = scratch.data();
    }
    if (gradient_in_place) p.alpha = static_cast<float>(1.0 / double(rows));
    cuda::matmul(p, stream);
    const std::int64_t n = out.tensor.numel();
    if (gradient_in_place)
      cuda::scale_by_device_scalar(p.c, input(op, "dloss", dloss), static_cast<float>(dloss_factor),
                                   cuda::DeviceGradOut<T>{out.tensor.data(), !direct && out.accumulate}, n, stream);
    else if (!direct && out.accumulate)
      cuda::add_into_accumulate(p.c, out.tensor.data(), n, stream);
    else if (!direct)
      POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(out.tensor.data(), p.c, std::size_t(n) * sizeof(T),
                                           cudaMemcpyDeviceToDevice, stream));
  };
  if (dx.wanted()) {
    detail::check_output(op, "dx", dx.tensor, x.shape());
    cuda::MatmulArgs<T> p;  // (R, C) = dlogits (R, ld) times head_weight (ld, C)
    p.m = rows, p.n = c, p.k = ld;
    p.a = logits.data();
    p.b = input(op, "weight", head_weight);
    product_into(p, dx, true);
  }
  if (dweight.wanted()) {
    detail::check_output(op, "dweight", dweight.tensor, Shape{v, c});
    cuda::MatmulArgs<T> p;  // (ld, C) = dlogits^T, stored (R, ld), times x (R, C): its first V rows
    p.m = ld, p.n = c, p.k = rows;
    p.a = logits.data(), p.trans_a = true;
    p.b = input(op, "x", x);
    product_into(p, dweight, ld == v);
  }
}

/// The loss and its gradient in one pass over the logits, for a mean loss over every row:
/// losses[i] as cross_entropy_forward; dlogits[i, :] (+)= dloss_scale (softmax - onehot), which
/// may be the logits tensor itself (the logits are not needed after the loss).
template <CudaFloatElement T>
void cross_entropy_fused(const Tensor<T, Cuda>& logits, const Tensor<std::int32_t, Cuda>& targets,
                         const Tensor<float, Cuda>& losses, float dloss_scale, const GradOut<T, Cuda>& dlogits) {
  const Shape rows = detail::row_shape(logits.shape());
  check_same_shape("cross_entropy targets", targets.shape(), rows);
  detail::check_output("cross_entropy", "losses", losses, rows);
  if (dlogits.wanted()) detail::check_output("cross_entropy", "dlogits", dlogits.tensor, logits.shape());
  cuda::cross_entropy_fused(detail::cuda_ops::input("cross_entropy", "logits", logits),
                            detail::cuda_ops::input("cross_entropy", "targets", targets), losses.data(), nullptr,
                            nullptr, dloss_scale, detail::cuda_ops::device_grad(dlogits), rows.numel(),
                            logits.size(-1), cuda::current_stream());
}

/// out[c] (+)= sum over rows of x[r, c] (a bias gradient). x: (..., C); out: (C,).
template <CudaFloatElement T>
void column_sum(const Tensor<T, Cuda>& x, const GradOut<T, Cuda>& out) {
  if (!out.wanted()) return;
  const std::int64_t c = x.size(-1), rows = x.shape().leading(1);
  detail::check_output("column_sum", "out", out.tensor, Shape{c});
  const std::size_t floats = cuda::column_sum_workspace_floats(rows, c);
  const auto workspace = detail::cuda_ops::scratch_floats(floats);
  cuda::column_sum(detail::cuda_ops::input("column_sum", "x", x), detail::cuda_ops::device_grad(out), rows, c,
                   workspace.data(), floats, cuda::current_stream());
}

namespace detail::cuda_ops {
/// A matrix operand as cuBLASLt takes it: transposed or not, its leading dimension and the
/// stride between batch elements (0 for a 2-D operand shared by every batch element).
template <class T>
struct Operand {
  Tensor<T, Cuda> view;
  MatrixLayout layout;
  std::int64_t batch_stride = 0;
};
/// Whether the batch dimensions (all but the last two) step by one uniform stride.
template <class T>
bool uniform_batches(const Tensor<T, Cuda>& t) {
  for (int i = 0; i + 3 < t.rank(); ++i)
    if (t.strides()[i] != t.strides()[i + 1] * t.size(i + 1)) return false;
  return true;
}
/// The operand for `t`; a view cuBLASLt cannot take as it is becomes a contiguous copy.
template <class T>
Operand<T> operand(const Tensor<T, Cuda>& t) {
  Operand<T> o{t, {false, std::max<std::int64_t>(t.size(-1), 1)}, 0};
  if (!gemm_layout(o.view, o.layout) || !uniform_batches(o.view)) {
    o.view = t.contiguous();
    o.layout = {false, std::max<std::int64_t>(t.size(-1), 1)};
  }
  if (o.view.rank() > 2) o.batch_stride = o.view.strides()[o.view.rank() - 3];
  return o;
}

/// Whether a bias (or bias gradient) vector is aligned as cuBLASLt's epilogue kernels are sure
/// to take it: 16 bytes. Parameters packed into a flat unit buffer need not be; they take the
/// separate pass instead.
inline bool vector_aligned(const void* p) { return cuda::detail::alignment_of(p) >= 16; }

/// The cuBLASLt arguments of C = alpha * A B + beta * C (shapes checked, k > 0), with the
/// operands they point into: keep it alive until the product is enqueued.
template <class T>
struct Product {
  Operand<T> a, b;
  cuda::MatmulArgs<T> args;

  Product(const Tensor<T, Cuda>& ta, const Tensor<T, Cuda>& tb, const Tensor<T, Cuda>& c, float alpha, float beta)
      : a(operand(ta)), b(operand(tb)) {
    const std::int64_t m = ta.size(-2), n = tb.size(-1);
    const bool shared_b = tb.rank() == 2;
    const std::int64_t batch = ta.shape().leading(2);
    args.k = ta.size(-1);
    args.a = a.view.data(), args.lda = a.layout.ld, args.trans_a = a.layout.transposed;
    args.b = b.view.data(), args.ldb = b.layout.ld, args.trans_b = b.layout.transposed;
    args.c = c.data(), args.ldc = n;
    args.alpha = alpha, args.beta = beta;
    if (shared_b && !a.layout.transposed && (batch == 1 || a.view.is_contiguous())) {
      // A plain A times a shared B is one tall product over every batch row.
      args.m = batch * m, args.n = n;
    } else {
      args.m = m, args.n = n;
      args.batch_count = batch;
      args.stride_a = a.batch_stride, args.stride_b = shared_b ? 0 : b.batch_stride, args.stride_c = m * n;
    }
  }
};
}  // namespace detail::cuda_ops

/// C = alpha * A B + beta * C through cuBLASLt (fp32 accumulation; TF32 off, so fp32 products
/// agree with the CPU's). A: (..., M, K); B: (K, N) shared by every batch element or (..., K, N)
/// with A's batch shape; C: (..., M, N) contiguous. A and B may be transposed views.
template <CudaFloatElement T>
void matmul_into(const Tensor<T, Cuda>& a, const Tensor<T, Cuda>& b, const Tensor<T, Cuda>& c, float alpha = 1.0f,
                 float beta = 0.0f) {
  detail::check_matmul_output(a, b, c);
  if (c.numel() == 0) return;
  if (a.size(-1) == 0) {  // an empty sum: C = beta C, and beta = 0 never reads C (it may hold NaN)
    if (beta == 0.0f)
      c.fill(T(0.0f));
    else
      scale_into(c, beta, c);
    return;
  }
  const detail::cuda_ops::Product<T> p(a, b, c, alpha, beta);
  cuda::matmul(p.args, cuda::current_stream());
}
template <CudaFloatElement T>
Tensor<T, Cuda> matmul(const Tensor<T, Cuda>& a, const Tensor<T, Cuda>& b) {
  auto c = Tensor<T, Cuda>::empty(detail::matmul_output_shape(a, b));
  matmul_into(a, b, c);
  return c;
}

/// y = x weight^T (+ bias): the device's twin of the host's linear_forward. One cuBLASLt
/// product whose epilogue adds the bias, so y is written once. x: (R, in); weight: (out, in);
/// bias: (out) or undefined; y: (R, out), contiguous.
template <CudaFloatElement T>
void linear_forward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& weight, const Tensor<T, Cuda>& bias,
                    const Tensor<T, Cuda>& y) {
  detail::check_linear("linear", x, weight, bias, y);
  const Tensor<T, Cuda> b = bias.defined() ? bias.contiguous() : bias;
  if (!b.defined() || y.numel() == 0 || x.size(1) == 0 || !detail::cuda_ops::vector_aligned(b.data())) {
    matmul_into(x, weight.transpose(), y);
    if (b.defined()) add_bias_into(y, b);
    return;
  }
  detail::cuda_ops::Product<T> p(x, weight.transpose(), y, 1.0f, 0.0f);
  p.args.epilogue = cuda::Epilogue::Bias;
  p.args.bias = b.data();
  cuda::matmul(p.args, cuda::current_stream());
}

/// The gradients of linear_forward: the device's twin of the host's linear_backward. Where the
/// bias gradient is overwritten (not accumulated) alongside the weight's, the weight gradient's
/// product dy^T x sums dy's columns into it in its epilogue, instead of a pass of its own.
template <CudaFloatElement T>
void linear_backward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& weight, const Tensor<T, Cuda>& dy,
                     const GradOut<T, Cuda>& dx, const GradOut<T, Cuda>& dweight, const GradOut<T, Cuda>& dbias) {
  check_same_shape("linear backward", dy.shape(), Shape{x.size(0), weight.size(0)});
  const auto beta = [](bool accumulate) { return accumulate ? 1.0f : 0.0f; };
  if (dx.wanted()) matmul_into(dy, weight, dx.tensor, 1.0f, beta(dx.accumulate));
  bool bias_done = false;
  if (dweight.wanted()) {
    const bool fold_bias = dbias.wanted() && !dbias.accumulate && x.numel() > 0 && dy.numel() > 0 &&
                           detail::cuda_ops::vector_aligned(dbias.tensor.data());
    if (!fold_bias) {
      matmul_into(dy.transpose(), x, dweight.tensor, 1.0f, beta(dweight.accumulate));
    } else {
      detail::check_matmul_output(dy.transpose(), x, dweight.tensor);
      detail::check_output("linear backward", "dbias", dbias.tensor, Shape{weight.size(0)});
      detail::cuda_ops::Product<T> p(dy.transpose(), x, dweight.tensor, 1.0f, beta(dweight.accumulate));
      if (p.args.trans_a) {  // cuBLASLt sums A into a bias only from a transposed view
        p.args.epilogue = cuda::Epilogue::BiasGradA;
        p.args.bias_grad = dbias.tensor.data();
        bias_done = true;
      }
      cuda::matmul(p.args, cuda::current_stream());
    }
  }
  if (dbias.wanted() && !bias_done) column_sum(dy, dbias);
}

/// h = x weight^T + bias and y = GELU(h) from one cuBLASLt product whose epilogue adds the bias,
/// applies GELU and also stores h into `aux` (for gelu_product_backward): an MLP's first layer
/// and its activation without a pass of their own over the (R, out) activations. Where the
/// epilogue cannot run (out not a multiple of 8, an unaligned pointer, an empty product), the
/// same as linear_forward into aux and gelu_forward. x: (R, in); weight: (out, in); bias: (out);
/// y, aux: (R, out), contiguous.
template <CudaFloatElement T>
void linear_gelu_forward(const Tensor<T, Cuda>& x, const Tensor<T, Cuda>& weight, const Tensor<T, Cuda>& bias,
                         const Tensor<T, Cuda>& y, const Tensor<T, Cuda>& aux) {
  POLYSHARD_CHECK(bias.defined(), "linear_gelu: a bias is required");
  detail::check_linear("linear_gelu", x, weight, bias, y);
  detail::check_output("linear_gelu", "aux", aux, y.shape());
  const Tensor<T, Cuda> b = bias.contiguous();
  const std::int64_t out = weight.size(0);
  using detail::cuda_ops::vector_aligned;
  if (y.numel() == 0 || x.size(1) == 0 || out % 8 != 0 || !vector_aligned(b.data()) || !vector_aligned(aux.data())) {
    linear_forward(x, weight, b, aux);
    gelu_forward(aux, y);
    return;
  }
  detail::cuda_ops::Product<T> p(x, weight.transpose(), y, 1.0f, 0.0f);
  p.args.epilogue = cuda::Epilogue::BiasGeluAux;
  p.args.bias = b.data();
  p.args.aux = aux.data(), p.args.aux_ld = out;
  cuda::matmul(p.args, cuda::current_stream());
}

/// dh = (dy weight) * GELU'(aux): the input gradient of a linear layer whose input was GELU(aux),
/// carried through the GELU in the product's epilogue, so the gradient of the GELU's output is
/// never stored. Where the epilogue cannot run, the product into dh and gelu_backward in place.
/// dy: (R, out); weight: (out, in); aux: (R, in) the saved GELU input; dh: (R, in), written.
template <CudaFloatElement T>
void gelu_product_backward(const Tensor<T, Cuda>& dy, const Tensor<T, Cuda>& weight, const Tensor<T, Cuda>& aux,
                           const Tensor<T, Cuda>& dh) {
  check_same_shape("gelu_product backward", dy.shape(), Shape{aux.size(0), weight.size(0)});
  check_same_shape("gelu_product backward", aux.shape(), Shape{dy.size(0), weight.size(1)});
  detail::check_output("gelu_product backward", "dh", dh, aux.shape());
  const std::int64_t in = weight.size(1);
  if (dh.numel() == 0 || dy.size(1) == 0 || in % 8 != 0 || !detail::cuda_ops::vector_aligned(aux.data())) {
    matmul_into(dy, weight, dh);
    gelu_backward(aux, dh, GradOut<T, Cuda>{dh, false});
    return;
  }
  detail::cuda_ops::Product<T> p(dy, weight, dh, 1.0f, 0.0f);
  p.args.epilogue = cuda::Epilogue::DGelu;
  p.args.aux = aux.data(), p.args.aux_ld = in;
  cuda::matmul(p.args, cuda::current_stream());
}

/// Causal self-attention of GPT-2's fused projections, as the CPU op computes it: per head,
/// softmax(q k^T / sqrt(D)) over keys up to the query's position, times v. qkv: (B, T, 3C);
/// out: (B, T, C); att: (B, n_head, T, T), the probabilities saved for the backward pass.
/// Batched products through cuBLASLt around the fused causal softmax.
template <CudaFloatElement T>
void causal_self_attention_forward(const Tensor<T, Cuda>& qkv, int n_head, const Tensor<T, Cuda>& out,
                                   const Tensor<T, Cuda>& att) {
  POLYSHARD_CHECK(qkv.rank() == 3 && n_head > 0 && qkv.size(2) % (3 * n_head) == 0, "causal_self_attention: qkv ",
                  qkv.shape(), " is not (B, T, 3C) with C a multiple of n_head = ", n_head);
  const std::int64_t nb = qkv.size(0), nt = qkv.size(1), c = qkv.size(2) / 3, hd = c / n_head;
  detail::check_output("causal_self_attention", "out", out, Shape{nb, nt, c});
  detail::check_output("causal_self_attention", "att", att, Shape{nb, n_head, nt, nt});
  const cudaStream_t stream = cuda::current_stream();
  const Shape heads{nb, n_head, nt, hd};  // (B, H, T, D)
  auto q = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  auto k = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  auto v = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  cuda::attention_permute_forward(detail::cuda_ops::input("causal_self_attention", "qkv", qkv), q.data(), k.data(),
                                  v.data(), nb, nt, n_head, hd, stream);
  matmul_into(q, k.transpose(), att);  // raw scores (B, H, T, T); the softmax scales them
  cuda::causal_softmax_forward(att.data(), static_cast<float>(1.0 / std::sqrt(double(hd))), att.data(), nb * n_head,
                               nt, stream);
  auto y = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  matmul_into(att, v, y);  // (B, H, T, D)
  cuda::attention_unpermute_forward(y.data(), out.data(), nb, nt, n_head, hd, stream);
}

/// Gradient of causal_self_attention_forward with respect to qkv, from the saved probabilities.
/// qkv: (B, T, 3C); att: (B, n_head, T, T); dout: (B, T, C); dqkv: (B, T, 3C), written or added to.
template <CudaFloatElement T>
void causal_self_attention_backward(const Tensor<T, Cuda>& qkv, const Tensor<T, Cuda>& att,
                                    const Tensor<T, Cuda>& dout, int n_head, const GradOut<T, Cuda>& dqkv) {
  if (!dqkv.wanted()) return;
  POLYSHARD_CHECK(qkv.rank() == 3 && n_head > 0 && qkv.size(2) % (3 * n_head) == 0,
                  "causal_self_attention backward: qkv ", qkv.shape(), " is not (B, T, 3C) with C a multiple of n_head = ",
                  n_head);
  const std::int64_t nb = qkv.size(0), nt = qkv.size(1), c = qkv.size(2) / 3, hd = c / n_head;
  check_same_shape("causal_self_attention backward", att.shape(), Shape{nb, n_head, nt, nt});
  check_same_shape("causal_self_attention backward", dout.shape(), Shape{nb, nt, c});
  detail::check_output("causal_self_attention backward", "dqkv", dqkv.tensor, qkv.shape());
  using detail::cuda_ops::input;
  const cudaStream_t stream = cuda::current_stream();
  const Shape heads{nb, n_head, nt, hd};  // (B, H, T, D)
  auto q = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  auto k = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  auto v = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  cuda::attention_permute_forward(input("causal_self_attention backward", "qkv", qkv), q.data(), k.data(), v.data(),
                                  nb, nt, n_head, hd, stream);
  auto dy = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  cuda::attention_unpermute_backward(input("causal_self_attention backward", "dout", dout), dy.data(), nb, nt, n_head,
                                     hd, stream);
  auto dv = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  matmul_into(att.transpose(), dy, dv);  // P^T dy
  auto dp = Tensor<T, Cuda>::empty(att.shape(), MemoryCategory::Activations);
  matmul_into(dy, v.transpose(), dp);  // dy v^T: (B, H, T, T)
  auto ds = Tensor<T, Cuda>::empty(att.shape(), MemoryCategory::Activations);
  cuda::causal_softmax_backward(input("causal_self_attention backward", "att", att), dp.data(),
                                static_cast<float>(1.0 / std::sqrt(double(hd))), cuda::DeviceGradOut<T>{ds.data(), false},
                                nb * n_head, nt, stream);  // gradient of the raw scores, scale included
  auto dq = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  auto dk = Tensor<T, Cuda>::empty(heads, MemoryCategory::Activations);
  matmul_into(ds, k, dq);              // dS k
  matmul_into(ds.transpose(), q, dk);  // dS^T q
  cuda::attention_permute_backward(dq.data(), dk.data(), dv.data(), detail::cuda_ops::device_grad(dqkv), nb, nt,
                                   n_head, hd, stream);
}

/// Whether the fused kernels are allowed at all: POLYSHARD_FUSED_ATTENTION=0 in the environment
/// keeps every attention on the materialized kernels (for comparisons; read once).
inline bool fused_attention_enabled() {
  static const bool enabled = detail::on_unless_zero("POLYSHARD_FUSED_ATTENTION");
  return enabled;
}

/// Whether the fused kernels (flash_attention.hpp) compute attention over qkv (B, T, 3C) with
/// n_head heads: 16-bit elements and a head dimension they take. Float keeps the materialized
/// kernels, whose products are float throughout.
template <CudaFloatElement T>
bool fused_attention_supports(const Tensor<T, Cuda>& qkv, int n_head) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    return qkv.rank() == 3 && n_head > 0 && qkv.size(2) % (3 * n_head) == 0 &&
           cuda::flash_attention_supports(qkv.size(2) / (3 * n_head));
  }
}

/// Whether causal_self_attention on a Var takes the fused kernels: where they compute it, unless
/// POLYSHARD_FUSED_ATTENTION=0 turned them off.
template <CudaFloatElement T>
bool fused_attention_applies(const Tensor<T, Cuda>& qkv, int n_head) {
  return fused_attention_enabled() && fused_attention_supports(qkv, n_head);
}

namespace detail::cuda_ops {
/// The fused ops' refusal of what the kernels do not compute, naming the op and the shape.
template <class T>
void check_fused_attention(const char* op, const Tensor<T, Cuda>& qkv, int n_head) {
  POLYSHARD_CHECK(fused_attention_supports(qkv, n_head), op, ": qkv ", qkv.shape(), " with n_head = ", n_head,
                  " is not (B, T, 3C) of 16-bit elements with a head dimension of 16, 32, 64 or 128");
}

/// The fused kernels' view of GPT-2's qkv (B, T, 3C): q, k and v a third each, stride 3C.
inline cuda::AttentionShape gpt_attention_shape(const Shape& qkv, int n_head) {
  const std::int64_t c = qkv[2] / 3;
  return {.batch = qkv[0], .seq = qkv[1], .n_head = n_head, .n_kv_head = n_head, .head_dim = c / n_head,
          .stride = 3 * c, .out_stride = c};
}
}  // namespace detail::cuda_ops

/// causal_self_attention_forward by the fused kernels: out as there; instead of the (B, n_head,
/// T, T) probabilities, lse (B, n_head, T) float, each query row's log-sum-exp, for the backward.
template <Cuda16BitElement T>
void causal_self_attention_fused_forward(const Tensor<T, Cuda>& qkv, int n_head, const Tensor<T, Cuda>& out,
                                         const Tensor<float, Cuda>& lse) {
  const char* op = "causal_self_attention (fused)";
  detail::cuda_ops::check_fused_attention(op, qkv, n_head);
  const std::int64_t nb = qkv.size(0), nt = qkv.size(1), c = qkv.size(2) / 3;
  detail::check_output(op, "out", out, Shape{nb, nt, c});
  detail::check_output(op, "lse", lse, Shape{nb, n_head, nt});
  const T* p = detail::cuda_ops::input(op, "qkv", qkv);
  cuda::flash_attention_forward(p, p + c, p + 2 * c, out.data(), lse.data(),
                                detail::cuda_ops::gpt_attention_shape(qkv.shape(), n_head), cuda::current_stream());
}

/// The gradient of causal_self_attention_fused_forward with respect to qkv, from its input, its
/// output and lse (the probabilities recomputed tile by tile). dqkv: (B, T, 3C), written or
/// added to.
template <Cuda16BitElement T>
void causal_self_attention_fused_backward(const Tensor<T, Cuda>& qkv, const Tensor<T, Cuda>& out,
                                          const Tensor<float, Cuda>& lse, const Tensor<T, Cuda>& dout, int n_head,
                                          const GradOut<T, Cuda>& dqkv) {
  if (!dqkv.wanted()) return;
  const char* op = "causal_self_attention backward (fused)";
  detail::cuda_ops::check_fused_attention(op, qkv, n_head);
  const std::int64_t nb = qkv.size(0), nt = qkv.size(1), c = qkv.size(2) / 3;
  check_same_shape(op, out.shape(), Shape{nb, nt, c});
  check_same_shape(op, dout.shape(), Shape{nb, nt, c});
  check_same_shape(op, lse.shape(), Shape{nb, n_head, nt});
  detail::check_output(op, "dqkv", dqkv.tensor, qkv.shape());
  using detail::cuda_ops::input;
  const cuda::AttentionShape shape = detail::cuda_ops::gpt_attention_shape(qkv.shape(), n_head);
  auto workspace = detail::cuda_ops::scratch_floats(
      static_cast<std::size_t>(cuda::flash_attention_backward_workspace_floats(shape)));
  const T* p = input(op, "qkv", qkv);
  T* g = dqkv.tensor.data();
  cuda::flash_attention_backward(p, p + c, p + 2 * c, input(op, "out", out), input(op, "dout", dout),
                                 input(op, "lse", lse), cuda::DeviceGradOut<T>{g, dqkv.accumulate},
                                 cuda::DeviceGradOut<T>{g + c, dqkv.accumulate},
                                 cuda::DeviceGradOut<T>{g + 2 * c, dqkv.accumulate}, workspace.data(), shape,
                                 cuda::current_stream());
}

/// Whether the fused kernels compute grouped-query attention over separate q (B, T, n_head D)
/// and k, v (B, T, n_kv_head D) as they are, each key-value head read by its group of
/// n_head / n_kv_head query heads without being repeated: 16-bit elements, a head dimension
/// they take, n_kv_head dividing n_head, contiguous tensors.
template <CudaFloatElement T>
bool grouped_fused_attention_supports(const Tensor<T, Cuda>& q, const Tensor<T, Cuda>& k, const Tensor<T, Cuda>& v,
                                      int n_head, int n_kv_head) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    if (q.rank() != 3 || n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head != 0 || q.size(2) % n_head != 0)
      return false;
    const std::int64_t d = q.size(2) / n_head;
    const Shape kv{q.size(0), q.size(1), n_kv_head * d};
    return cuda::flash_attention_supports(d) && k.shape() == kv && v.shape() == kv && q.is_contiguous() &&
           k.is_contiguous() && v.is_contiguous();
  }
}

/// Whether grouped_causal_self_attention on Vars takes the fused kernels: where they compute it,
/// unless POLYSHARD_FUSED_ATTENTION=0 turned them off.
template <CudaFloatElement T>
bool grouped_fused_attention_applies(const Tensor<T, Cuda>& q, const Tensor<T, Cuda>& k, const Tensor<T, Cuda>& v,
                                     int n_head, int n_kv_head) {
  return fused_attention_enabled() && grouped_fused_attention_supports(q, k, v, n_head, n_kv_head);
}

namespace detail::cuda_ops {
/// The fused kernels' view of separate q (B, T, n_head D), k and v (B, T, n_kv_head D), refused
/// with the op's name where they do not compute it.
template <class T>
cuda::AttentionShape grouped_attention_shape(const char* op, const Tensor<T, Cuda>& q, const Tensor<T, Cuda>& k,
                                             const Tensor<T, Cuda>& v, int n_head, int n_kv_head) {
  POLYSHARD_CHECK(grouped_fused_attention_supports(q, k, v, n_head, n_kv_head), op, ": q ", q.shape(),
                  ", k ", k.shape(), " and v ", v.shape(), " with ", n_head, " query heads and ", n_kv_head,
                  " key-value heads are not contiguous 16-bit (B, T, n_head D) and (B, T, n_kv_head D) with "
                  "n_kv_head dividing n_head and D one of 16, 32, 64 and 128");
  const std::int64_t d = q.size(2) / n_head;
  return {.batch = q.size(0), .seq = q.size(1), .n_head = n_head, .n_kv_head = n_kv_head, .head_dim = d,
          .stride = n_head * d, .kv_stride = n_kv_head * d, .out_stride = n_head * d};
}
}  // namespace detail::cuda_ops

/// Grouped-query causal attention by the fused kernels, the key-value heads read in place: out
/// (B, T, n_head D) = each query head's softmax(q k^T / sqrt(D), causal) v over key-value head
/// h / (n_head / n_kv_head); lse (B, n_head, T) float for the backward.
template <Cuda16BitElement T>
void grouped_attention_fused_forward(const Tensor<T, Cuda>& q, const Tensor<T, Cuda>& k, const Tensor<T, Cuda>& v,
                                     int n_head, int n_kv_head, const Tensor<T, Cuda>& out,
                                     const Tensor<float, Cuda>& lse) {
  const char* op = "grouped causal attention (fused)";
  const cuda::AttentionShape shape = detail::cuda_ops::grouped_attention_shape(op, q, k, v, n_head, n_kv_head);
  detail::check_output(op, "out", out, q.shape());
  detail::check_output(op, "lse", lse, Shape{shape.batch, n_head, shape.seq});
  using detail::cuda_ops::input;
  cuda::flash_attention_forward(input(op, "q", q), input(op, "k", k), input(op, "v", v), out.data(), lse.data(), shape,
                                cuda::current_stream());
}

/// The gradients of grouped_attention_fused_forward with respect to q, k and v, each written or
/// added to; dk and dv sum their group's query heads inside the kernel.
template <Cuda16BitElement T>
void grouped_attention_fused_backward(const Tensor<T, Cuda>& q, const Tensor<T, Cuda>& k, const Tensor<T, Cuda>& v,
                                      const Tensor<T, Cuda>& out, const Tensor<float, Cuda>& lse,
                                      const Tensor<T, Cuda>& dout, int n_head, int n_kv_head, const GradOut<T, Cuda>& dq,
                                      const GradOut<T, Cuda>& dk, const GradOut<T, Cuda>& dv) {
  if (!(dq.wanted() || dk.wanted() || dv.wanted())) return;
  const char* op = "grouped causal attention backward (fused)";
  const cuda::AttentionShape shape = detail::cuda_ops::grouped_attention_shape(op, q, k, v, n_head, n_kv_head);
  check_same_shape(op, out.shape(), q.shape());
  check_same_shape(op, dout.shape(), q.shape());
  check_same_shape(op, lse.shape(), Shape{shape.batch, n_head, shape.seq});
  if (dq.wanted()) detail::check_output(op, "dq", dq.tensor, q.shape());
  if (dk.wanted()) detail::check_output(op, "dk", dk.tensor, k.shape());
  if (dv.wanted()) detail::check_output(op, "dv", dv.tensor, v.shape());
  using detail::cuda_ops::input;
  auto workspace = detail::cuda_ops::scratch_floats(
      static_cast<std::size_t>(cuda::flash_attention_backward_workspace_floats(shape)));
  const auto device = [](const GradOut<T, Cuda>& g) {
    return g.wanted() ? cuda::DeviceGradOut<T>{g.tensor.data(), g.accumulate} : cuda::DeviceGradOut<T>{};
  };
  // The kernel writes dk and dv together, either both written or both added to: where they
  // differ, dv goes through scratch and is added or copied after.
  const bool apart = dk.wanted() && dv.wanted() && dk.accumulate != dv.accumulate;
  Tensor<T, Cuda> dv_scratch = apart ? Tensor<T, Cuda>::empty(v.shape(), MemoryCategory::Activations) : Tensor<T, Cuda>{};
  const cuda::DeviceGradOut<T> dv_out =
      apart ? cuda::DeviceGradOut<T>{dv_scratch.data(), dk.accumulate} : device(dv);
  cuda::flash_attention_backward(input(op, "q", q), input(op, "k", k), input(op, "v", v), input(op, "out", out),
                                 input(op, "dout", dout), input(op, "lse", lse), device(dq), device(dk), dv_out,
                                 workspace.data(), shape, cuda::current_stream());
  if (apart) {
    if (dv.accumulate)
      add_into(dv.tensor, dv_scratch, dv.tensor);
    else
      dv.tensor.copy_from(dv_scratch);
  }
}

}  // namespace polyshard
