// The fused optimizer kernels (Adam, AdamW, SGD): elementwise, one thread per group of V
// consecutive elements, each element computed with the CPU kernels' operations in their order.
//
// Every multiply, add, divide and square root below is an explicit round-to-nearest intrinsic
// (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn): nvcc never contracts those into FMAs and
// --use_fast_math cannot turn them into approximations, so the results do not depend on flags.
#include "polyshard/optim/cuda/fused_optimizers.hpp"

#include <algorithm>
#include <cmath>

#include "polyshard/core/cuda/device_math.cuh"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/optim/detail/adam_constants.hpp"

namespace polyshard::cuda {
namespace {

constexpr unsigned threads_per_block = 256;
// The tail after the whole V-groups (fewer than V <= 16 elements) goes one element per thread to
// the grid's first threads, so one block must have at least that many.
static_assert(threads_per_block >= 16 && threads_per_block % 32 == 0, "whole warps, enough for any tail");

// Elements per thread and group when every array is 16-byte aligned: one 128-bit access for the
// narrowest type, two for a float array beside a 16-bit one.
template <class... T>
constexpr int lanes_for() {
  return static_cast<int>(16 / std::min({sizeof(T)...}));
}

// ---- Adam / AdamW --------------------------------------------------------------------------------

// The host kernels' constants (computed in double, rounded to float), by value into the kernel.
using AdamScalars = polyshard::detail::AdamConstants<float>;

// One element, in AdamPacket's order (torch/optim/adam.py, _single_tensor_adam):
//   g = g + wd * p                         (Adam with weight decay)
//   p = p * (1 - lr * wd)                  (AdamW with weight decay)
//   m = lerp(m, g, 1 - beta1)              (ATen's two branches)
//   v = v * beta2 + ((1 - beta2) * g) * g
//   p = p + (-step_size) * (m / (sqrt(v) / sqrt(bias_correction2) + eps))
__device__ __forceinline__ void adam_element(float& p, float g, float& m, float& v, const AdamScalars& k) {
  if (k.coupled) g = __fadd_rn(g, __fmul_rn(k.coupled_decay, p));
  if (k.decoupled) p = __fmul_rn(p, k.decoupled_scale);
  m = k.lerp_low ? __fadd_rn(m, __fmul_rn(k.lerp_weight, __fsub_rn(g, m)))
                 : __fsub_rn(g, __fmul_rn(__fsub_rn(g, m), k.lerp_weight_complement));
  v = __fadd_rn(__fmul_rn(v, k.beta2), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bias_correction2_sqrt), k.eps);
  p = __fadd_rn(p, __fmul_rn(k.neg_step_size, __fdiv_rn(m, denom)));
}

// The compute-type copy of V updated master values, where the composition keeps one.
template <int V, class DP>
__device__ __forceinline__ void store_compute_copy(DP* __restrict__ compute, std::size_t i, const float (&p)[V]) {
  if (compute == nullptr) return;
  DP c[V];
#pragma unroll
  for (int j = 0; j < V; ++j) c[j] = from_float<DP>(p[j]);
  store_lanes<V>(compute + i, c);
}

// Elements [i, i + V) of every array.
template <int V, class DG, class DP>
__device__ __forceinline__ void adam_lanes(std::size_t i, float* __restrict__ master, const DG* __restrict__ grad,
                                           float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                                           DP* __restrict__ compute, const AdamScalars& k, float grad_scale) {
  float p[V], m[V], v[V];
  DG g[V];
  load_lanes<V>(master + i, p);
  load_lanes<V>(grad + i, g);
  load_lanes<V>(exp_avg + i, m);
  load_lanes<V>(exp_avg_sq + i, v);
#pragma unroll
  for (int j = 0; j < V; ++j) adam_element(p[j], __fmul_rn(to_float(g[j]), grad_scale), m[j], v[j], k);
  store_lanes<V>(master + i, p);
  store_lanes<V>(exp_avg + i, m);
  store_lanes<V>(exp_avg_sq + i, v);
  store_compute_copy<V>(compute, i, p);
}

// Grid-stride over the whole V-groups of [0, n); the last n % V elements (fewer than V) go one
// each to the grid's first threads. Every element is read and written by exactly one thread.
template <int V, class DG, class DP>
__global__ void __launch_bounds__(threads_per_block)
    fused_adam_kernel(float* __restrict__ master, const DG* __restrict__ grad, float* __restrict__ exp_avg,
                      float* __restrict__ exp_avg_sq, DP* __restrict__ compute, std::size_t n, AdamScalars k,
                      float grad_scale) {
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t whole = n / V * V;
  for (std::size_t i = first * V; i < whole; i += stride * V)
    adam_lanes<V>(i, master, grad, exp_avg, exp_avg_sq, compute, k, grad_scale);
  if (whole + first < n) adam_lanes<1>(whole + first, master, grad, exp_avg, exp_avg_sq, compute, k, grad_scale);
}

// ---- SGD -----------------------------------------------------------------------------------------

// polyshard::detail::SgdPacket<float>'s constants, by value into the kernel.
struct SgdScalars {
  float weight_decay, momentum, one_minus_dampening, neg_lr;
  bool decay;         // weight_decay != 0
  bool use_momentum;  // momentum != 0: a buffer is read (after step 1) and written
  bool first_step;    // step 1: the buffer starts as a copy of the gradient
  bool nesterov;
};

SgdScalars sgd_scalars(const SgdConfig& c, std::int64_t step) {
  SgdScalars k{};
  k.weight_decay = static_cast<float>(c.weight_decay);
  k.momentum = static_cast<float>(c.momentum);
  k.one_minus_dampening = static_cast<float>(1 - c.dampening);
  k.neg_lr = static_cast<float>(-c.lr);
  k.decay = c.weight_decay != 0;
  k.use_momentum = c.momentum != 0;
  k.first_step = step == 1;
  k.nesterov = c.nesterov;
  return k;
}

// Elements [i, i + V), in SgdPacket's order (torch/optim/sgd.py, _single_tensor_sgd):
//   g = g + wd * p
//   b = g on the first step, else b * momentum + (1 - dampening) * g
//   d = nesterov ? g + momentum * b : b          (d = g without momentum)
//   p = p + (-lr) * d
template <int V, class DG, class DP>
__device__ __forceinline__ void sgd_lanes(std::size_t i, float* __restrict__ master, const DG* __restrict__ grad,
                                          float* __restrict__ buffer, DP* __restrict__ compute, const SgdScalars& k,
                                          float grad_scale) {
  float p[V], b[V] = {};
  DG g[V];
  load_lanes<V>(master + i, p);
  load_lanes<V>(grad + i, g);
  if (k.use_momentum && !k.first_step) load_lanes<V>(buffer + i, b);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float d = __fmul_rn(to_float(g[j]), grad_scale);
    if (k.decay) d = __fadd_rn(d, __fmul_rn(k.weight_decay, p[j]));
    if (k.use_momentum) {
      b[j] = k.first_step ? d : __fadd_rn(__fmul_rn(b[j], k.momentum), __fmul_rn(k.one_minus_dampening, d));
      d = k.nesterov ? __fadd_rn(d, __fmul_rn(k.momentum, b[j])) : b[j];
    }
    p[j] = __fadd_rn(p[j], __fmul_rn(k.neg_lr, d));
  }
  store_lanes<V>(master + i, p);
  if (k.use_momentum) store_lanes<V>(buffer + i, b);
  store_compute_copy<V>(compute, i, p);
}

// The same split of [0, n) as fused_adam_kernel.
template <int V, class DG, class DP>
__global__ void __launch_bounds__(threads_per_block)
    fused_sgd_kernel(float* __restrict__ master, const DG* __restrict__ grad, float* __restrict__ buffer,
                     DP* __restrict__ compute, std::size_t n, SgdScalars k, float grad_scale) {
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t whole = n / V * V;
  for (std::size_t i = first * V; i < whole; i += stride * V)
    sgd_lanes<V>(i, master, grad, buffer, compute, k, grad_scale);
  if (whole + first < n) sgd_lanes<1>(whole + first, master, grad, buffer, compute, k, grad_scale);
}

// Blocks for n elements taken V at a time (at least one block, for the tail).
unsigned blocks_for(std::size_t n, int v) {
  return grid_for(std::max<std::size_t>(n / static_cast<std::size_t>(v), 1), threads_per_block);
}

}  // namespace

template <class G, class P>
void fused_adam_step(float* master, const G* grad, float* exp_avg, float* exp_avg_sq, P* compute, std::size_t numel,
                     const AdamConfig& config, std::int64_t step, bool decoupled_weight_decay, float grad_scale,
                     cudaStream_t stream) {
  const char* who = decoupled_weight_decay ? "fused_adamw_step" : "fused_adam_step";
  POLYSHARD_CHECK(step >= 1, who, ": step counts from 1, got ", step);
  detail::validate(config, who);
  POLYSHARD_CHECK(std::isfinite(grad_scale), who, ": grad_scale must be finite, got ", grad_scale);
  if (numel == 0) return;
  POLYSHARD_CHECK(master != nullptr && grad != nullptr && exp_avg != nullptr && exp_avg_sq != nullptr, who,
                  ": null array for ", numel, " elements (master ", static_cast<const void*>(master), ", grad ",
                  static_cast<const void*>(grad), ", exp_avg ", static_cast<const void*>(exp_avg), ", exp_avg_sq ",
                  static_cast<const void*>(exp_avg_sq), ")");
  POLYSHARD_CHECK(static_cast<const void*>(compute) != static_cast<const void*>(master), who,
                  ": the compute copy is the master array itself (pass nullptr when there is no copy)");
  using DG = device_t<G>;
  using DP = device_t<P>;
  const AdamScalars k = polyshard::detail::adam_constants<float>(config, step, decoupled_weight_decay);
  const auto g = device_ptr(grad);
  const auto c = device_ptr(compute);
  const bool packs = aligned16(master) && aligned16(g) && aligned16(exp_avg) && aligned16(exp_avg_sq) &&
                     (c == nullptr || aligned16(c));
  if (packs) {
    constexpr int V = lanes_for<float, DG, DP>();
    launch<fused_adam_kernel<V, DG, DP>>(blocks_for(numel, V), threads_per_block, 0, stream, master, g, exp_avg,
                                         exp_avg_sq, c, numel, k, grad_scale);
  } else {
    launch<fused_adam_kernel<1, DG, DP>>(blocks_for(numel, 1), threads_per_block, 0, stream, master, g, exp_avg,
                                         exp_avg_sq, c, numel, k, grad_scale);
  }
  POLYSHARD_CUDA_CHECK_LAUNCH(who);
}

template <class G, class P>
void fused_sgd_step(float* master, const G* grad, float* momentum_buffer, P* compute, std::size_t numel,
                    const SgdConfig& config, std::int64_t step, float grad_scale, cudaStream_t stream) {
  const char* who = "fused_sgd_step";
  POLYSHARD_CHECK(step >= 1, who, ": step counts from 1, got ", step);
  detail::validate(config, who);
  POLYSHARD_CHECK(std::isfinite(grad_scale), who, ": grad_scale must be finite, got ", grad_scale);
  const bool use_momentum = config.momentum != 0;
  POLYSHARD_CHECK((momentum_buffer != nullptr) == use_momentum || numel == 0, who, ": momentum ", config.momentum,
                  (use_momentum ? " needs a momentum_buffer, got nullptr" : " keeps no buffer, got one"));
  if (numel == 0) return;
  POLYSHARD_CHECK(master != nullptr && grad != nullptr, who, ": null array for ", numel, " elements (master ",
                  static_cast<const void*>(master), ", grad ", static_cast<const void*>(grad), ")");
  POLYSHARD_CHECK(static_cast<const void*>(compute) != static_cast<const void*>(master), who,
                  ": the compute copy is the master array itself (pass nullptr when there is no copy)");
  using DG = device_t<G>;
  using DP = device_t<P>;
  const SgdScalars k = sgd_scalars(config, step);
  const auto g = device_ptr(grad);
  const auto c = device_ptr(compute);
  const bool packs = aligned16(master) && aligned16(g) && (momentum_buffer == nullptr || aligned16(momentum_buffer)) &&
                     (c == nullptr || aligned16(c));
  if (packs) {
    constexpr int V = lanes_for<float, DG, DP>();
    launch<fused_sgd_kernel<V, DG, DP>>(blocks_for(numel, V), threads_per_block, 0, stream, master, g, momentum_buffer,
                                        c, numel, k, grad_scale);
  } else {
    launch<fused_sgd_kernel<1, DG, DP>>(blocks_for(numel, 1), threads_per_block, 0, stream, master, g, momentum_buffer,
                                        c, numel, k, grad_scale);
  }
  POLYSHARD_CUDA_CHECK_LAUNCH(who);
}

// The (gradient, compute copy) compositions of the precision policies: all fp32; bf16 or fp16
// gradients and weights; fp32 gradients kept beside a bf16 or fp16 compute copy.
#define POLYSHARD_INSTANTIATE_FUSED(G, P)                                                                     \
  template void fused_adam_step<G, P>(float*, const G*, float*, float*, P*, std::size_t, const AdamConfig&,     \
                                      std::int64_t, bool, float, cudaStream_t);                                 \
  template void fused_sgd_step<G, P>(float*, const G*, float*, P*, std::size_t, const SgdConfig&, std::int64_t, \
                                     float, cudaStream_t);
POLYSHARD_INSTANTIATE_FUSED(float, float)
POLYSHARD_INSTANTIATE_FUSED(bfloat16, bfloat16)
POLYSHARD_INSTANTIATE_FUSED(half, half)
POLYSHARD_INSTANTIATE_FUSED(float, bfloat16)
POLYSHARD_INSTANTIATE_FUSED(float, half)
#undef POLYSHARD_INSTANTIATE_FUSED

}  // namespace polyshard::cuda
