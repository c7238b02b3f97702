// Adam (and the kernel AdamW shares) over flat spans, with torch.optim.Adam's update rule.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/core/memory_tracker.hpp"
#include "polyshard/optim/config.hpp"
#include "polyshard/optim/detail/adam_constants.hpp"
#include "polyshard/optim/detail/elementwise.hpp"
#include "polyshard/optim/detail/x86_vectors.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

namespace detail {

// One packet, in PyTorch's order of operations (torch/optim/adam.py, _single_tensor_adam), the
// gradient first multiplied by grad_scale (a GradScaler's unscaling and a clipping coefficient):
//   grad = grad * grad_scale
//   grad = grad + wd * param                    (Adam with weight decay)
//   param = param * (1 - lr * wd)               (AdamW with weight decay)
//   exp_avg.lerp_(grad, 1 - beta1)
//   exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
//   param += -step_size * exp_avg / (sqrt(exp_avg_sq) / sqrt(bias_correction2) + eps)
template <class P>
struct AdamPacket {
  using Packet = packet_t<P>;
  explicit AdamPacket(const AdamConstants<P>& k)
      : k(k),
        lerp_weight(Eigen::internal::pset1<Packet>(k.lerp_weight)),
        lerp_weight_complement(Eigen::internal::pset1<Packet>(k.lerp_weight_complement)),
        beta2(Eigen::internal::pset1<Packet>(k.beta2)),
        one_minus_beta2(Eigen::internal::pset1<Packet>(k.one_minus_beta2)),
        coupled_decay(Eigen::internal::pset1<Packet>(k.coupled_decay)),
        decoupled_scale(Eigen::internal::pset1<Packet>(k.decoupled_scale)),
        neg_step_size(Eigen::internal::pset1<Packet>(k.neg_step_size)),
        bias_correction2_sqrt(Eigen::internal::pset1<Packet>(k.bias_correction2_sqrt)),
        eps(Eigen::internal::pset1<Packet>(k.eps)),
        grad_scale(Eigen::internal::pset1<Packet>(k.grad_scale)) {}

  void operator()(P* param, const P* grad, P* exp_avg, P* exp_avg_sq) const {
    using namespace Eigen::internal;
    Packet p = ploadu<Packet>(param);
    Packet g = pmul(ploadu<Packet>(grad), grad_scale);
    Packet m = ploadu<Packet>(exp_avg);
    Packet v = ploadu<Packet>(exp_avg_sq);
    if (k.coupled) g = padd(g, pmul(coupled_decay, p));
    if (k.decoupled) p = pmul(p, decoupled_scale);
    // at::lerp's two branches, chosen by the weight as ATen chooses them.
    m = k.lerp_low ? padd(m, pmul(lerp_weight, psub(g, m))) : psub(g, pmul(psub(g, m), lerp_weight_complement));
    v = padd(pmul(v, beta2), pmul(pmul(one_minus_beta2, g), g));
    const Packet denom = padd(pdiv(exact_psqrt(v), bias_correction2_sqrt), eps);
    p = padd(p, pmul(neg_step_size, pdiv(m, denom)));
    pstoreu(param, p);
    pstoreu(exp_avg, m);
    pstoreu(exp_avg_sq, v);
  }

  AdamConstants<P> k;
  Packet lerp_weight, lerp_weight_complement, beta2, one_minus_beta2, coupled_decay, decoupled_scale,
      neg_step_size, bias_correction2_sqrt, eps, grad_scale;
};

/// The sizes adam_update() requires: grad and both moments as long as param.
inline void check_adam_sizes(const char* who, std::size_t param, std::size_t grad, std::size_t exp_avg,
                             std::size_t exp_avg_sq) {
  POLYSHARD_CHECK(grad == param && exp_avg == param && exp_avg_sq == param, who, ": sizes differ: param ", param,
                  ", grad ", grad, ", exp_avg ", exp_avg, ", exp_avg_sq ", exp_avg_sq);
}

}  // namespace detail

namespace detail {

/// One Adam or AdamW step over P's spans, on the vector kernels of optimizer_isa() for fp32 (or
/// the portable ones), split across the worker pool; `copy`, when not null, receives the updated
/// weights rounded to C in the same pass.
template <class P, class G, class C>
void adam_spans(std::span<P> param, const G* grad, std::span<P> exp_avg, std::span<P> exp_avg_sq, C* copy,
                const AdamConstants<P>& k) {
  const CpuIsa isa = optimizer_isa();
  const AdamPacket<P> body(k);
  parallel_ranges(param.size(), [&](std::size_t begin, std::size_t end) {
    if constexpr (std::same_as<P, float>) {
      if (vector_adam_range(isa, end - begin, param.data() + begin, grad + begin, exp_avg.data() + begin,
                            exp_avg_sq.data() + begin, copy ? copy + begin : nullptr, k))
        return;
    }
    with_grad_as<P>(grad, begin, end, [&](std::size_t offset, std::size_t count, const P* g) {
      for_each_packet<P>(count, body, param.data() + offset, g, exp_avg.data() + offset, exp_avg_sq.data() + offset);
    });
    if (copy)
      for (std::size_t i = begin; i < end; ++i) copy[i] = element_cast<C>(param[i]);
  });
}

}  // namespace detail

/// One Adam or AdamW step over flat spans: a whole tensor, a shard of a flat buffer, or any
/// slice of one; updating a span in slices gives the same bits as updating it whole, on any
/// instruction set (optim/detail/cpu_isa.hpp) and any number of threads (set_optimizer_threads).
///   param       master parameters (P = float or double; half and bfloat16 below), updated in place;
///   grad        gradients of any FloatElement type, converted to P element by element;
///   exp_avg     first moment estimate, same size, zero before the first step;
///   exp_avg_sq  second moment estimate, same size, zero before the first step;
///   config      hyperparameters (PyTorch's names and defaults);
///   step        the step being taken, counting from 1 (drives the bias corrections);
///   decoupled_weight_decay  false: Adam (weight decay adds to the gradient);
///                           true: AdamW (weights shrink by lr * weight_decay before the step);
///   grad_scale  every gradient is multiplied by it, rounded to P, before anything else (1 / loss
///               scale times a clipping coefficient: no pass of its own over the gradients).
/// Throws polyshard::Error when the sizes differ, step < 1 or grad_scale is not finite.
template <class P, class G>
  requires(std::same_as<P, float> || std::same_as<P, double>) && FloatElement<G>
void adam_update(std::span<P> param, std::span<const G> grad, std::span<P> exp_avg, std::span<P> exp_avg_sq,
                 const AdamConfig& config, std::int64_t step, bool decoupled_weight_decay, double grad_scale = 1.0) {
  const char* who = decoupled_weight_decay ? "adamw_update" : "adam_update";
  detail::check_adam_sizes(who, param.size(), grad.size(), exp_avg.size(), exp_avg_sq.size());
  POLYSHARD_CHECK(step >= 1, who, ": step counts from 1, got ", step);
  detail::check_grad_scale(who, grad_scale);
  detail::validate(config, who);
  detail::adam_spans(param, grad.data(), exp_avg, exp_avg_sq, static_cast<P*>(nullptr),
                     detail::adam_constants<P>(config, step, decoupled_weight_decay, grad_scale));
}

/// adam_update() over fp32 master weights that also writes the updated weights, rounded to the
/// 16-bit type C, into `compute` (the copy a mixed-precision model computes with), in the same
/// pass over memory: the bits of adam_update() followed by element_cast<C>.
template <class G, class C>
  requires FloatElement<G> && (std::same_as<C, half> || std::same_as<C, bfloat16>)
void adam_update(std::span<float> param, std::span<const G> grad, std::span<float> exp_avg,
                 std::span<float> exp_avg_sq, const AdamConfig& config, std::int64_t step,
                 bool decoupled_weight_decay, std::span<C> compute, double grad_scale = 1.0) {
  const char* who = decoupled_weight_decay ? "adamw_update" : "adam_update";
  detail::check_adam_sizes(who, param.size(), grad.size(), exp_avg.size(), exp_avg_sq.size());
  POLYSHARD_CHECK(compute.size() == param.size(), who, ": the compute copy has ", compute.size(),
                  " elements, param ", param.size());
  POLYSHARD_CHECK(step >= 1, who, ": step counts from 1, got ", step);
  detail::check_grad_scale(who, grad_scale);
  detail::validate(config, who);
  detail::adam_spans(param, grad.data(), exp_avg, exp_avg_sq, compute.data(),
                     detail::adam_constants<float>(config, step, decoupled_weight_decay, grad_scale));
}

/// adam_update() over 16-bit master weights and moments (PureBf16): computed in float, each
/// value rounded to P once per step.
template <class P, class G>
  requires(std::same_as<P, half> || std::same_as<P, bfloat16>) && FloatElement<G>
void adam_update(std::span<P> param, std::span<const G> grad, std::span<P> exp_avg, std::span<P> exp_avg_sq,
                 const AdamConfig& config, std::int64_t step, bool decoupled_weight_decay, double grad_scale = 1.0) {
  detail::check_adam_sizes(decoupled_weight_decay ? "adamw_update" : "adam_update", param.size(), grad.size(),
                           exp_avg.size(), exp_avg_sq.size());
  detail::update_widened<P>(
      param.size(),
      [&](std::size_t begin, std::span<float> p, std::span<float> m, std::span<float> v) {
        adam_update<float, G>(p, grad.subspan(begin, p.size()), m, v, config, step, decoupled_weight_decay,
                              grad_scale);
      },
      param, exp_avg, exp_avg_sq);
}

/// adam_update() for gradients in a mutable span (Tensor::span() gives one), which template
/// deduction would not convert to std::span<const G>.
template <class P, class G>
  requires FloatElement<P> && FloatElement<G>
void adam_update(std::span<P> param, std::span<G> grad, std::span<P> exp_avg, std::span<P> exp_avg_sq,
                 const AdamConfig& config, std::int64_t step, bool decoupled_weight_decay, double grad_scale = 1.0) {
  adam_update<P, G>(param, std::span<const G>(grad), exp_avg, exp_avg_sq, config, step, decoupled_weight_decay,
                    grad_scale);
}

namespace detail {

// The state and bookkeeping Adam and AdamW share; `Name` is the optimizer named in messages.
template <class P, class Config, bool Decoupled>
class AdamBase {
 public:
  using param_type = P;
  using config_type = Config;

  AdamBase(Config config, std::size_t numel, const char* name)
      : config_(config),
        numel_(numel),
        name_(name),
        exp_avg_(Tensor<P>::zeros(Shape{static_cast<std::int64_t>(numel)}, MemoryCategory::OptimizerState)),
        exp_avg_sq_(Tensor<P>::zeros(Shape{static_cast<std::int64_t>(numel)}, MemoryCategory::OptimizerState)) {
    validate(static_cast<AdamConfig>(config), name);
  }

  template <class G>
    requires FloatElement<G>
  void step(std::span<P> params, std::span<const G> grads, double grad_scale = 1.0) {
    POLYSHARD_CHECK(params.size() == numel_ && grads.size() == numel_, name_, "::step: built for ", numel_,
                    " elements, got params of ", params.size(), " and grads of ", grads.size());
    adam_update<P, G>(params, grads, exp_avg_.span(), exp_avg_sq_.span(), static_cast<AdamConfig>(config_),
                      step_ + 1, Decoupled, grad_scale);
    ++step_;
  }
  /// step() for gradients in a mutable span (Tensor::span() gives one).
  template <class G>
    requires FloatElement<G>
  void step(std::span<P> params, std::span<G> grads, double grad_scale = 1.0) {
    step(params, std::span<const G>(grads), grad_scale);
  }
  /// step() over fp32 masters that also writes the 16-bit compute copy in the same pass.
  template <class G, class C>
    requires std::same_as<P, float> && FloatElement<G> && (std::same_as<C, half> || std::same_as<C, bfloat16>)
  void step(std::span<P> params, std::span<const G> grads, std::span<C> compute, double grad_scale = 1.0) {
    POLYSHARD_CHECK(params.size() == numel_ && grads.size() == numel_, name_, "::step: built for ", numel_,
                    " elements, got params of ", params.size(), " and grads of ", grads.size());
    adam_update<G, C>(params, grads, exp_avg_.span(), exp_avg_sq_.span(), static_cast<AdamConfig>(config_), step_ + 1,
                      Decoupled, compute, grad_scale);
    ++step_;
  }

  std::int64_t step_count() const { return step_; }
  /// Restores the step counter with the state from a checkpoint (it drives the bias correction).
  void set_step_count(std::int64_t step) {
    POLYSHARD_CHECK(step >= 0, name_, "::set_step_count: negative step ", step);
    step_ = step;
  }
  double lr() const { return config_.lr; }
  void set_lr(double lr) {
    POLYSHARD_CHECK(lr >= 0, name_, "::set_lr: invalid learning rate ", lr);
    config_.lr = lr;
  }
  const Config& config() const { return config_; }
  std::size_t numel() const { return numel_; }
  std::size_t state_bytes() const { return exp_avg_.bytes() + exp_avg_sq_.bytes(); }
  /// The state tensors by PyTorch's names. They share storage with the optimizer: a checkpoint
  /// reads them, a restore copies into them (Tensor::copy_from) and calls set_step_count().
  std::vector<std::pair<std::string, Tensor<P>>> state() const {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }

 private:
  Config config_;
  std::size_t numel_;
  const char* name_;
  Tensor<P> exp_avg_;     // (numel,)
  Tensor<P> exp_avg_sq_;  // (numel,)
  std::int64_t step_ = 0;
};

}  // namespace detail

/// Adam over one flat parameter span of a fixed size, owning its moment estimates
/// (2 * numel * sizeof(P) bytes, counted as MemoryCategory::OptimizerState). Weight decay, if
/// any, is the L2 penalty added to the gradient, as in torch.optim.Adam.
///   step(params, grads[, grad_scale])  one step; grads of any FloatElement type, each times
///                        grad_scale first (adam_update); throws polyshard::Error naming the
///                        optimizer and the sizes when they differ from numel;
///   step_count(), set_step_count(n), lr(), set_lr(x), config(), numel(), state_bytes(),
///   state(): {"exp_avg", "exp_avg_sq"} sharing storage with the optimizer.
template <class P>
class Adam : public detail::AdamBase<P, AdamConfig, false> {
 public:
  /// config: hyperparameters; numel: size of the parameter span every step() receives.
  Adam(AdamConfig config, std::size_t numel) : detail::AdamBase<P, AdamConfig, false>(config, numel, "Adam") {}
};

}  // namespace polyshard
