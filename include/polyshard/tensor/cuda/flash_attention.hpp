// Fused causal attention on the GPU, by the FlashAttention-2 algorithm: tiles of queries, keys and
// values in shared memory, the products on tensor cores (WMMA, 16-bit inputs with float sums), an
// online softmax, and only the output and each row's log-sum-exp kept for the backward pass,
// which recomputes the probabilities tile by tile. Attention's activations are then O(B H T)
// instead of the materialized kernels' (B, H, T, T) (transformer_kernels.hpp, which stay the
// reference the tests hold these to). Plain C++: raw device pointers, sizes and a stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "polyshard/tensor/cuda/transformer_kernels.hpp"  // DeviceGradOut

namespace polyshard::cuda {

/// Where the heads of one attention sit in memory: position t of batch b of query head h is the
/// head_dim elements at q + (b T + t) stride + h head_dim; key and value heads likewise from k
/// and v, shared by groups of n_head / n_kv_head consecutive query heads (grouped-query
/// attention; n_kv_head = n_head is multi-head attention). GPT-2's fused projection (B, T, 3C):
/// q = qkv, k = qkv + C, v = qkv + 2C, stride 3C. Keys and values may sit apart from the
/// queries, (B, T, n_kv_head head_dim) each, with a stride of their own (kv_stride). The output,
/// (B, T, n_head head_dim), has its own stride.
struct AttentionShape {
  std::int64_t batch = 0, seq = 0, n_head = 0, n_kv_head = 0, head_dim = 0;
  std::int64_t stride = 0;      // elements between consecutive positions of q (and of k and v)
  std::int64_t kv_stride = 0;   // of k and v, where it is not 0
  std::int64_t out_stride = 0;  // elements between consecutive positions of the output
};

/// Whether the fused kernels compute this head dimension (16, 32, 64 or 128); the callers keep
/// the materialized kernels for any other.
bool flash_attention_supports(std::int64_t head_dim);

/// out = softmax(q k^T / sqrt(head_dim), causal) v for every head; lse[(b n_head + h) T + t] =
/// the log of the row's sum of exp(scores / sqrt(head_dim)), for the backward pass (float).
/// T is half or bfloat16.
// q, k, v: see AttentionShape; out: (B, T, out_stride); lse: (B, n_head, T) float
template <class T>
void flash_attention_forward(const T* q, const T* k, const T* v, T* out, float* lse, const AttentionShape& shape,
                             cudaStream_t stream);

/// Floats of device workspace flash_attention_backward needs: two a query row and head.
std::int64_t flash_attention_backward_workspace_floats(const AttentionShape& shape);

/// The gradients of flash_attention_forward with respect to q, k and v, from its inputs, its
/// output, the output's gradient and its lse: dq, dk and dv in the layout of q, k and v (the
/// same strides), each written or added to (DeviceGradOut). The probabilities are recomputed tile
/// by tile; every sum runs in a fixed order (no atomics), so the result is bitwise reproducible.
/// `workspace` holds flash_attention_backward_workspace_floats(shape) floats.
template <class T>
void flash_attention_backward(const T* q, const T* k, const T* v, const T* out, const T* dout, const float* lse,
                              DeviceGradOut<T> dq, DeviceGradOut<T> dk, DeviceGradOut<T> dv, float* workspace,
                              const AttentionShape& shape, cudaStream_t stream);

}  // namespace polyshard::cuda
