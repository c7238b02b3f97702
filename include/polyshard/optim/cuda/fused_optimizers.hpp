// Fused optimizer steps on the GPU: one pass reads the fp32 master weights, the gradient and the
// fp32 state, and writes the master, the state and the compute-type copy of the weights.
// Plain C++ (no Eigen): the launchers' definitions live in fused_optimizers.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "polyshard/core/element_fwd.hpp"
#include "polyshard/optim/config.hpp"

namespace polyshard::cuda {

/// One Adam or AdamW step over a flat span on the GPU: the twin of
/// polyshard::adam_update<float, G>, with the same per-step constants (computed on the host in
/// double, rounded to float) and the same order of IEEE float operations, none of them contracted
/// into an FMA, so that it agrees with the CPU to the last bit wherever the CPU's compiler did not
/// contract one either. Element i uses the gradient grad[i] * grad_scale, rounded to float.
///   master      (numel,) fp32 master weights, updated in place;
///   grad        (numel,) gradients of type G (float, half or bfloat16), read only;
///   exp_avg     (numel,) fp32 first moment estimate, updated in place; zero before step 1;
///   exp_avg_sq  (numel,) fp32 second moment estimate, updated in place; zero before step 1;
///   compute     (numel,) compute copy of type P (float, half or bfloat16), written with the new
///               master rounded to nearest even; nullptr when the compute type is the master's
///               own (no copy to refresh);
///   numel       elements in every array; 0 launches nothing;
///   config      hyperparameters (PyTorch's names and defaults);
///   step        the step being taken, counting from 1 (drives the bias corrections);
///   decoupled_weight_decay  false: Adam (weight decay adds wd * master to the gradient);
///                           true: AdamW (master shrinks by lr * wd before the step);
///   grad_scale  multiplies every gradient on the fly: 1 / loss_scale times the clipping
///               coefficient (1: none); finite;
///   stream      the stream the kernel runs in.
/// Device pointers, any alignment (16-byte aligned arrays take 128-bit loads and stores); the
/// arrays must not overlap. Throws polyshard::Error naming the op when step < 1, the config is
/// invalid, grad_scale is not finite, or an array other than `compute` is null with numel > 0.
template <class G, class P>
void fused_adam_step(float* master, const G* grad, float* exp_avg, float* exp_avg_sq, P* compute, std::size_t numel,
                     const AdamConfig& config, std::int64_t step, bool decoupled_weight_decay, float grad_scale,
                     cudaStream_t stream);

/// fused_adam_step() for AdamW's config (decoupled weight decay, PyTorch's default of 1e-2);
/// every pointer as there.
template <class G, class P>
void fused_adamw_step(float* master, const G* grad, float* exp_avg, float* exp_avg_sq, P* compute, std::size_t numel,
                      const AdamWConfig& config, std::int64_t step, float grad_scale, cudaStream_t stream) {
  fused_adam_step<G, P>(master, grad, exp_avg, exp_avg_sq, compute, numel, static_cast<AdamConfig>(config), step,
                        true, grad_scale, stream);
}

/// One SGD step over a flat span on the GPU: the twin of polyshard::sgd_update<float, G>
/// (momentum, dampening, Nesterov, coupled weight decay), in the same order of uncontracted IEEE
/// float operations. Element i uses the gradient grad[i] * grad_scale, rounded to float.
///   master           (numel,) fp32 master weights, updated in place;
///   grad             (numel,) gradients of type G (float, half or bfloat16), read only;
///   momentum_buffer  (numel,) fp32 momentum buffer, updated in place, when config.momentum != 0
///                    (not read on step 1, which starts it as a copy of the gradient);
///                    nullptr when config.momentum == 0;
///   compute          (numel,) compute copy of type P, written with the new master rounded to
///                    nearest even; nullptr when there is none;
///   numel            elements in every array; 0 launches nothing;
///   config           hyperparameters (PyTorch's names);
///   step             the step being taken, counting from 1;
///   grad_scale       multiplies every gradient on the fly (1 / loss_scale times the clipping
///                    coefficient); finite;
///   stream           the stream the kernel runs in.
/// Device pointers, any alignment; the arrays must not overlap. Throws polyshard::Error naming
/// the op when step < 1, the config is invalid, grad_scale is not finite, or a required array is
/// null (or momentum_buffer is given without momentum).
template <class G, class P>
void fused_sgd_step(float* master, const G* grad, float* momentum_buffer, P* compute, std::size_t numel,
                    const SgdConfig& config, std::int64_t step, float grad_scale, cudaStream_t stream);

}  // namespace polyshard::cuda
