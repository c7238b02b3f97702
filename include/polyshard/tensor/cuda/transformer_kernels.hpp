// Launchers of the GPT's CUDA kernels (forward and backward), each the twin of the CPU op of the
// same name in polyshard/tensor/ops/. Plain C++: raw device pointers, sizes and a stream; the
// kernels live in transformer_kernels.cu, instantiated for T = float, half and bfloat16.
// Arithmetic runs in float for every T. Each launcher checks its sizes (polyshard::Error with a
// sentence naming the op and the value), launches, and checks the launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "polyshard/core/element_fwd.hpp"

namespace polyshard::cuda {

/// One gradient output of a backward launcher, the device twin of GradOut: the kernel
/// overwrites `data`, or adds to it when `accumulate` is true; a null `data` means the gradient
/// is not wanted and the kernel skips it (and the work that only it needs).
template <class T>
struct DeviceGradOut {
  T* data = nullptr;
  bool accumulate = false;
  bool wanted() const { return data != nullptr; }
};

// ---- embedding ------------------------------------------------------------------------------

/// out[i, :] = table[ids[i], :]. An id outside [0, V) (which the CPU op rejects with an error)
/// reads nothing and makes its output row NaN, so that the loss shows it.
// ids: (N,) int32; table: (V, C); out: (N, C)
template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* out, std::int64_t n, std::int64_t v,
                       std::int64_t c, cudaStream_t stream);

/// Bytes of device workspace embedding_backward needs for `n` ids into a table of `v` rows.
std::size_t embedding_backward_workspace_bytes(std::int64_t n, std::int64_t v);

/// dtable[ids[i], :] (+)= dout[i, :], deterministic: the ids are sorted (stably, with their
/// positions) and each table row sums its positions in increasing order in float, then adds
/// the sum to the row once; no atomics. dtable is zeroed first unless it accumulates. An id
/// outside [0, V) is skipped (nothing is written for it). `workspace` holds at least
/// embedding_backward_workspace_bytes(n, v) bytes (any alignment: the sizes include the slack
/// to carve it at 256-byte boundaries).
// ids: (N,) int32; dout: (N, C); dtable: (V, C)
template <class T>
void embedding_backward(const std::int32_t* ids, const T* dout, DeviceGradOut<T> dtable, std::int64_t n,
                        std::int64_t v, std::int64_t c, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream);

// ---- layer norm -----------------------------------------------------------------------------

/// y = (x - mean) * rstd * weight + bias over each row, rstd = 1 / sqrt(var + eps) with the biased
/// variance (two passes: mean, then squared deviations), one warp per row. mean and rstd are
/// written as float for the backward pass; either may be null (inference).
// x, y: (rows, C); weight, bias: (C,); mean, rstd: (rows,) float
template <class T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, float eps, T* y, float* mean, float* rstd,
                        std::int64_t rows, std::int64_t c, cudaStream_t stream);

/// Floats of device workspace layer_norm_backward needs when dweight or dbias is wanted.
std::size_t layer_norm_backward_workspace_floats(std::int64_t rows, std::int64_t c);

/// Gradients of layer_norm_forward. With xhat = (x - mean) rstd and g = dy weight:
/// dx = rstd (g - mean(g) - xhat mean(g xhat)) per row (one warp per row);
/// dweight = sum over rows of dy xhat, dbias = sum over rows of dy (deterministic: per-chunk
/// column sums into `workspace`, then a fixed-order sum over chunks). Each output is skipped
/// when not wanted; `workspace` (at least layer_norm_backward_workspace_floats(rows, c) floats)
/// may be null when neither dweight nor dbias is wanted.
// x, dy, dx: (rows, C); weight, dweight, dbias: (C,); mean, rstd: (rows,) float
template <class T>
void layer_norm_backward(const T* x, const T* weight, const float* mean, const float* rstd, const T* dy,
                         DeviceGradOut<T> dx, DeviceGradOut<T> dweight, DeviceGradOut<T> dbias, std::int64_t rows,
                         std::int64_t c, float* workspace, std::size_t workspace_floats, cudaStream_t stream);

// ---- grouped-query key-value sharing ---------------------------------------------------------------

/// qkv = [q | repeat(k) | repeat(v)] per row, query head j reading key-value head
/// j / (n_head / n_kv_head) (see the CPU grouped_qkv_forward).
// q: (rows, n_head * head_dim); k, v: (rows, n_kv_head * head_dim); qkv: (rows, 3 * n_head * head_dim)
template <class T>
void grouped_qkv_forward(const T* q, const T* k, const T* v, T* qkv, std::int64_t rows, std::int64_t head_dim,
                         std::int64_t n_head, std::int64_t n_kv_head, cudaStream_t stream);

/// dq (+)= the q part of dqkv; dk, dv (+)= each key-value element's group of copies, summed in
/// head order in float (deterministic). Each output skipped when not wanted.
template <class T>
void grouped_qkv_backward(const T* dqkv, DeviceGradOut<T> dq, DeviceGradOut<T> dk, DeviceGradOut<T> dv,
                          std::int64_t rows, std::int64_t head_dim, std::int64_t n_head, std::int64_t n_kv_head,
                          cudaStream_t stream);

// ---- rotary position embedding -------------------------------------------------------------------

/// out (+)= x with each pair (i, i + d/2) of the row at (b, t, h) turned by the angle
/// (t + offset) theta^(-2i/d), or back by it (`inverse`: the backward pass); Hugging Face's
/// rotate-half layout. Angles, cosines and sines in double, as the CPU twin. `out` must not
/// alias `x`.
// x, out: (batch, positions, heads, head_dim), head_dim even
template <class T>
void rope_rotate(const T* x, DeviceGradOut<T> out, std::int64_t batch, std::int64_t positions, std::int64_t heads,
                 std::int64_t head_dim, double theta, std::int64_t offset, bool inverse, cudaStream_t stream);

// ---- RMS norm -----------------------------------------------------------------------------------

/// y = x rstd weight over each row, rstd = 1 / sqrt(mean(x^2) + eps) (torch.nn.RMSNorm); rstd
/// saved for backward (may be null). One warp per row, the sum of squares in float.
// x, y: (rows, C); weight: (C,); rstd: (rows,) float
template <class T>
void rms_norm_forward(const T* x, const T* weight, float eps, T* y, float* rstd, std::int64_t rows, std::int64_t c,
                      cudaStream_t stream);

/// Floats of device workspace rms_norm_backward needs when dweight is wanted.
std::size_t rms_norm_backward_workspace_floats(std::int64_t rows, std::int64_t c);

/// Gradients of rms_norm_forward. With xhat = x rstd and g = dy weight: dx = rstd (g - xhat
/// mean(g xhat)) per row (one warp per row); dweight = sum over rows of dy xhat (deterministic,
/// as layer_norm_backward's). Each output is skipped when not wanted; `workspace` (at least
/// rms_norm_backward_workspace_floats(rows, c) floats) may be null when dweight is not wanted.
// x, dy, dx: (rows, C); weight, dweight: (C,); rstd: (rows,) float
template <class T>
void rms_norm_backward(const T* x, const T* weight, const float* rstd, const T* dy, DeviceGradOut<T> dx,
                       DeviceGradOut<T> dweight, std::int64_t rows, std::int64_t c, float* workspace,
                       std::size_t workspace_floats, cudaStream_t stream);

// ---- SiLU ---------------------------------------------------------------------------------------

/// y = x sigmoid(x), elementwise; y may alias x.
// x, y: (n,)
template <class T>
void silu_forward(const T* x, T* y, std::int64_t n, cudaStream_t stream);

/// dx (+)= dy * silu'(x), from the forward input x; dx may alias dy.
// x, dy, dx: (n,)
template <class T>
void silu_backward(const T* x, const T* dy, DeviceGradOut<T> dx, std::int64_t n, cudaStream_t stream);

// ---- GELU (tanh approximation) -----------------------------------------------------------------

/// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise; y may alias x.
// x, y: (n,)
template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n, cudaStream_t stream);

/// dx (+)= dy * gelu'(x), from the forward input x; dx may alias dy.
// x, dy, dx: (n,)
template <class T>
void gelu_backward(const T* x, const T* dy, DeviceGradOut<T> dx, std::int64_t n, cudaStream_t stream);

// ---- elementwise (residuals) ----------------------------------------------------------------

/// out = a + b, elementwise; out may alias a or b.
// a, b, out: (n,)
template <class T>
void add_into(const T* a, const T* b, T* out, std::int64_t n, cudaStream_t stream);

/// y += x, elementwise (a residual gradient adding into another).
// x, y: (n,)
template <class T>
void add_into_accumulate(const T* x, T* y, std::int64_t n, cudaStream_t stream);

/// out = s * x, elementwise, s rounded to float (as the CPU op does for float, half and bfloat16);
/// out may alias x.
// x, out: (n,)
template <class T>
void scale_into(const T* x, double s, T* out, std::int64_t n, cudaStream_t stream);

/// out = a * b elementwise. a, b, out: (n,); out may alias an input.
template <class T>
void mul_into(const T* a, const T* b, T* out, std::int64_t n, cudaStream_t stream);

/// y += s * x elementwise. x, y: (n,).
template <class T>
void add_scaled_into(const T* x, double s, T* y, std::int64_t n, cudaStream_t stream);

/// y[r, c] += bias[c]: a bias broadcast over rows. y: (rows, cols); bias: (cols,).
template <class T>
void add_bias_rows(T* y, const T* bias, std::int64_t rows, std::int64_t cols, cudaStream_t stream);

/// *out = the sum of x, added in double in a fixed order (the same bits every run).
/// x: (n,); out: one double in device memory; workspace: sum_workspace_doubles() doubles.
inline constexpr int sum_blocks = 256;
inline constexpr std::size_t sum_workspace_doubles() { return sum_blocks; }
template <class T>
void sum(const T* x, std::int64_t n, double* out, double* workspace, cudaStream_t stream);

// ---- softmax --------------------------------------------------------------------------------

/// y = exp(x - max) / sum(exp(x - max)) over each row, one block per row; y may alias x.
// x, y: (rows, N)
template <class T>
void softmax_forward(const T* x, T* y, std::int64_t rows, std::int64_t n, cudaStream_t stream);

/// dx (+)= y (dy - sum(dy y)) per row, from the forward output y; dx may alias dy.
// y, dy, dx: (rows, N)
template <class T>
void softmax_backward(const T* y, const T* dy, DeviceGradOut<T> dx, std::int64_t rows, std::int64_t n,
                      cudaStream_t stream);

/// Attention probabilities from raw scores q k^T: row t of each (T, T) matrix is the softmax of
/// scale * scores[t, 0..t] (query t sees keys 0..t), followed by zeros for keys t+1..T-1.
/// Scores above the diagonal are never read; probs may alias scores.
// scores, probs: (BH, T, T) with BH = batch * n_head
template <class T>
void causal_softmax_forward(const T* scores, float scale, T* probs, std::int64_t bh, std::int64_t t,
                            cudaStream_t stream);

/// Gradient with respect to the raw scores: dscores[t, j] (+)= scale * p[t, j] (dp[t, j] -
/// sum over k <= t of p[t, k] dp[t, k]) for j <= t; above the diagonal dscores is written 0
/// (left as it is when accumulating). dprobs above the diagonal is never read.
// probs, dprobs, dscores: (BH, T, T)
template <class T>
void causal_softmax_backward(const T* probs, const T* dprobs, float scale, DeviceGradOut<T> dscores,
                             std::int64_t bh, std::int64_t t, cudaStream_t stream);

// ---- attention layout glue (the batched products between them are cuBLASLt's) -----------------

/// Splits GPT-2's fused qkv, laid out [q | k | v] along the last dimension with the heads
/// contiguous inside each third (as the CPU attention op reads it), into per-head tensors:
/// q[b, h, t, d] = qkv[b, t, h*D + d], k from C + h*D + d, v from 2C + h*D + d (C = H*D).
// qkv: (B, T, 3C); q, k, v: (B, H, T, D)
template <class T>
void attention_permute_forward(const T* qkv, T* q, T* k, T* v, std::int64_t b, std::int64_t t, std::int64_t n_head,
                               std::int64_t head_dim, cudaStream_t stream);

/// The inverse of attention_permute_forward, for the gradient: dqkv (+)= [dq | dk | dv]
/// in qkv's layout.
// dq, dk, dv: (B, H, T, D); dqkv: (B, T, 3C)
template <class T>
void attention_permute_backward(const T* dq, const T* dk, const T* dv, DeviceGradOut<T> dqkv, std::int64_t b,
                                std::int64_t t, std::int64_t n_head, std::int64_t head_dim, cudaStream_t stream);

/// Concatenates the heads of the attention output: out[b, t, h*D + d] = y[b, h, t, d].
// y: (B, H, T, D); out: (B, T, C)
template <class T>
void attention_unpermute_forward(const T* y, T* out, std::int64_t b, std::int64_t t, std::int64_t n_head,
                                 std::int64_t head_dim, cudaStream_t stream);

/// The inverse of attention_unpermute_forward, for the gradient: dy[b, h, t, d] = dout[b, t, h*D + d]
/// (overwritten: dy is an intermediate).
// dout: (B, T, C); dy: (B, H, T, D)
template <class T>
void attention_unpermute_backward(const T* dout, T* dy, std::int64_t b, std::int64_t t, std::int64_t n_head,
                                  std::int64_t head_dim, cudaStream_t stream);

// ---- cross-entropy --------------------------------------------------------------------------

/// losses[r] = lse[r] - logits[r, targets[r]], lse[r] = log(sum(exp(logits[r, :]))) with an online
/// max and sum in float, one block per row. A target outside [0, V) (which the CPU op rejects)
/// gives a NaN loss. Losses and lse are float whatever T is; lse may be null.
// logits: (rows, V); targets: (rows,) int32; losses, lse: (rows,) float
template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, float* losses, float* lse,
                           std::int64_t rows, std::int64_t v, cudaStream_t stream);

/// dlogits[r, :] (+)= g[r] (softmax(logits[r, :]) - onehot(targets[r])), the softmax rebuilt from
/// the saved lse, with g[r] = dloss_scale * dlosses[r] (dloss_scale alone when dlosses is null).
/// A target outside [0, V) contributes no onehot term. dlogits may alias logits.
// logits, dlogits: (rows, V); targets: (rows,) int32; lse, dlosses: (rows,) float
template <class T>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, const float* lse, const float* dlosses,
                            float dloss_scale, DeviceGradOut<T> dlogits, std::int64_t rows, std::int64_t v,
                            cudaStream_t stream);

/// cross_entropy_forward and cross_entropy_backward in one launch, the logits read twice per
/// row instead of three times: losses (and lse, when not null) as in the forward, then dlogits
/// as in the backward. dlogits may alias logits (in place): each row's target logit is read
/// before any of the row is written.
// logits, dlogits: (rows, V); targets: (rows,) int32; losses, lse, dlosses: (rows,) float
template <class T>
void cross_entropy_fused(const T* logits, const std::int32_t* targets, float* losses, float* lse,
                         const float* dlosses, float dloss_scale, DeviceGradOut<T> dlogits, std::int64_t rows,
                         std::int64_t v, cudaStream_t stream);

/// cross_entropy_forward over rows `ld` elements apart (ld >= v): the head's logits in a buffer
/// whose rows are padded to an aligned length; the columns past v are not read.
// logits: (rows, ld); targets: (rows,) int32; losses, lse: (rows,) float
template <class T>
void cross_entropy_rows_forward(const T* logits, std::int64_t ld, const std::int32_t* targets, float* losses,
                                float* lse, std::int64_t rows, std::int64_t v, cudaStream_t stream);

/// cross_entropy_backward over rows `ld` elements apart, with g[r] also multiplied by *dloss when
/// dloss is not null: a loss's gradient read on the device, so that no host waits for it. The
/// columns past v are neither read nor written.
// logits, dlogits: (rows, ld); targets: (rows,) int32; lse, dlosses: (rows,) float; dloss: one T
template <class T>
void cross_entropy_rows_backward(const T* logits, std::int64_t ld, const std::int32_t* targets, const float* lse,
                                 const float* dlosses, float dloss_scale, const T* dloss, DeviceGradOut<T> dlogits,
                                 std::int64_t rows, std::int64_t v, cudaStream_t stream);

/// cross_entropy_fused over rows `ld` elements apart (ld >= v), writing g (softmax - onehot) with
/// g = dloss_scale: the head's loss and its gradient in one pass over the logits, which dlogits
/// may alias. The columns past v are neither read nor written.
// logits, dlogits: (rows, ld); targets: (rows,) int32; losses, lse: (rows,) float
template <class T>
void cross_entropy_rows_fused(const T* logits, std::int64_t ld, const std::int32_t* targets, float* losses,
                              float* lse, float dloss_scale, DeviceGradOut<T> dlogits, std::int64_t rows,
                              std::int64_t v, cudaStream_t stream);

/// y (+)= factor * dloss[0] * x, elementwise, with dloss read on the device: a product of an
/// unscaled gradient brought to a loss's gradient that no host waits for. y may alias x.
// x, y: (n,); dloss: one T
template <class T>
void scale_by_device_scalar(const T* x, const T* dloss, float factor, DeviceGradOut<T> y, std::int64_t n,
                            cudaStream_t stream);

/// out[0] = the mean of losses[0, n) (n >= 1), summed in double in a fixed order, rounded to T:
/// a mean loss that stays on the device.
template <class T>
void mean_of_losses(const float* losses, std::int64_t n, T* out, cudaStream_t stream);

// ---- column sum (bias gradients) ------------------------------------------------------------

/// Floats of device workspace column_sum needs.
std::size_t column_sum_workspace_floats(std::int64_t rows, std::int64_t cols);

/// out[c] (+)= sum over rows of x[r, c], in float and deterministic: per-chunk column sums into
/// `workspace` (at least column_sum_workspace_floats(rows, cols) floats), then a fixed-order
/// sum over chunks. With rows = 0 the output is zeroed (or left as it is when accumulating).
// x: (rows, cols); out: (cols,)
template <class T>
void column_sum(const T* x, DeviceGradOut<T> out, std::int64_t rows, std::int64_t cols, float* workspace,
                std::size_t workspace_floats, cudaStream_t stream);

}  // namespace polyshard::cuda
