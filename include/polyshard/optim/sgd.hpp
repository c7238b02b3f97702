// SGD with momentum, dampening, Nesterov and weight decay over flat spans (torch.optim.SGD).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/core/memory_tracker.hpp"
#include "polyshard/optim/config.hpp"
#include "polyshard/optim/detail/elementwise.hpp"
#include "polyshard/optim/detail/sgd_constants.hpp"
#include "polyshard/optim/detail/x86_vectors.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

namespace detail {

// One packet, in PyTorch's order of operations (torch/optim/sgd.py, _single_tensor_sgd), the
// gradient first multiplied by grad_scale (a GradScaler's unscaling and a clipping coefficient):
//   grad = grad * grad_scale
//   grad = grad + wd * param
//   buf = grad on the first step, else buf * momentum + (1 - dampening) * grad
//   grad = nesterov ? grad + momentum * buf : buf
//   param += -lr * grad
// Called with a momentum buffer when momentum != 0 and without one otherwise.
template <class P>
struct SgdPacket {
  using Packet = packet_t<P>;
  explicit SgdPacket(const SgdConstants<P>& k)
      : decay(k.decay),
        first_step(k.first_step),
        nesterov(k.nesterov),
        weight_decay(Eigen::internal::pset1<Packet>(k.weight_decay)),
        momentum(Eigen::internal::pset1<Packet>(k.momentum)),
        one_minus_dampening(Eigen::internal::pset1<Packet>(k.one_minus_dampening)),
        neg_lr(Eigen::internal::pset1<Packet>(k.neg_lr)),
        grad_scale(Eigen::internal::pset1<Packet>(k.grad_scale)) {}

  Packet decayed_grad(const P* param, const P* grad) const {
    using namespace Eigen::internal;
    const Packet g = pmul(ploadu<Packet>(grad), grad_scale);
    return decay ? padd(g, pmul(weight_decay, ploadu<Packet>(param))) : g;
  }

  void operator()(P* param, const P* grad) const {
    using namespace Eigen::internal;
    pstoreu(param, padd(ploadu<Packet>(param), pmul(neg_lr, decayed_grad(param, grad))));
  }

  void operator()(P* param, const P* grad, P* momentum_buffer) const {
    using namespace Eigen::internal;
    const Packet g = decayed_grad(param, grad);
    // PyTorch's buffer starts as a copy of the gradient: no dampening on the first step.
    const Packet b = first_step ? g : padd(pmul(ploadu<Packet>(momentum_buffer), momentum), pmul(one_minus_dampening, g));
    const Packet d = nesterov ? padd(g, pmul(momentum, b)) : b;
    pstoreu(param, padd(ploadu<Packet>(param), pmul(neg_lr, d)));
    pstoreu(momentum_buffer, b);
  }

  bool decay, first_step, nesterov;
  Packet weight_decay, momentum, one_minus_dampening, neg_lr, grad_scale;
};

/// The sizes sgd_update() requires: grad as long as param, and a momentum buffer exactly when momentum is on.
inline void check_sgd_sizes(std::size_t param, std::size_t grad, std::size_t momentum_buffer, const SgdConfig& config) {
  POLYSHARD_CHECK(grad == param, "sgd_update: sizes differ: param ", param, ", grad ", grad);
  const std::size_t expected = config.momentum != 0 ? param : 0;
  POLYSHARD_CHECK(momentum_buffer == expected, "sgd_update: momentum_buffer has ", momentum_buffer,
                  " elements, expected ", expected, " (momentum ", config.momentum, ")");
}

/// One SGD step over P's spans, on the vector kernels of optimizer_isa() for fp32 (or the
/// portable ones), split across the worker pool; `copy`, when not null, receives the updated
/// weights rounded to C in the same pass.
template <class P, class G, class C>
void sgd_spans(std::span<P> param, const G* grad, std::span<P> momentum_buffer, C* copy, const SgdConstants<P>& k) {
  const CpuIsa isa = optimizer_isa();
  const SgdPacket<P> body(k);
  const bool use_momentum = !momentum_buffer.empty();
  parallel_ranges(param.size(), [&](std::size_t begin, std::size_t end) {
    if constexpr (std::same_as<P, float>) {
      if (vector_sgd_range(isa, end - begin, param.data() + begin, grad + begin,
                           use_momentum ? momentum_buffer.data() + begin : nullptr, copy ? copy + begin : nullptr, k))
        return;
    }
    with_grad_as<P>(grad, begin, end, [&](std::size_t offset, std::size_t count, const P* g) {
      if (use_momentum) {
        for_each_packet<P>(count, body, param.data() + offset, g, momentum_buffer.data() + offset);
      } else {
        for_each_packet<P>(count, body, param.data() + offset, g);
      }
    });
    if (copy)
      for (std::size_t i = begin; i < end; ++i) copy[i] = element_cast<C>(param[i]);
  });
}

}  // namespace detail

/// One SGD step over flat spans: a whole tensor, a shard of a flat buffer, or any slice of one;
/// updating a span in slices gives the same bits as updating it whole, on any instruction set
/// and any number of threads.
///   param            master parameters (P = float or double; half and bfloat16 below), updated in place;
///   grad             gradients of any FloatElement type, converted to P element by element;
///   momentum_buffer  same size as param when config.momentum != 0 (its contents before step 1
///                    are ignored: the first step copies the gradient in), empty otherwise;
///   config           hyperparameters (PyTorch's names);
///   step             the step being taken, counting from 1 (step 1 starts the momentum buffer);
///   grad_scale       every gradient is multiplied by it, rounded to P, before anything else (1 /
///                    loss scale times a clipping coefficient: no pass of its own over the gradients).
/// Throws polyshard::Error when the sizes differ, step < 1, Nesterov lacks momentum, or
/// grad_scale is not finite.
template <class P, class G>
  requires(std::same_as<P, float> || std::same_as<P, double>) && FloatElement<G>
void sgd_update(std::span<P> param, std::span<const G> grad, std::span<P> momentum_buffer, const SgdConfig& config,
                std::int64_t step, double grad_scale = 1.0) {
  detail::check_sgd_sizes(param.size(), grad.size(), momentum_buffer.size(), config);
  POLYSHARD_CHECK(step >= 1, "sgd_update: step counts from 1, got ", step);
  detail::check_grad_scale("sgd_update", grad_scale);
  detail::validate(config, "sgd_update");
  detail::sgd_spans(param, grad.data(), momentum_buffer, static_cast<P*>(nullptr),
                    detail::sgd_constants<P>(config, step, grad_scale));
}

/// sgd_update() over fp32 master weights that also writes the updated weights, rounded to the
/// 16-bit type C, into `compute` in the same pass: the bits of sgd_update() then element_cast<C>.
template <class G, class C>
  requires FloatElement<G> && (std::same_as<C, half> || std::same_as<C, bfloat16>)
void sgd_update(std::span<float> param, std::span<const G> grad, std::span<float> momentum_buffer,
                const SgdConfig& config, std::int64_t step, std::span<C> compute, double grad_scale = 1.0) {
  detail::check_sgd_sizes(param.size(), grad.size(), momentum_buffer.size(), config);
  POLYSHARD_CHECK(compute.size() == param.size(), "sgd_update: the compute copy has ", compute.size(),
                  " elements, param ", param.size());
  POLYSHARD_CHECK(step >= 1, "sgd_update: step counts from 1, got ", step);
  detail::check_grad_scale("sgd_update", grad_scale);
  detail::validate(config, "sgd_update");
  detail::sgd_spans(param, grad.data(), momentum_buffer, compute.data(),
                    detail::sgd_constants<float>(config, step, grad_scale));
}

/// sgd_update() over 16-bit master weights and momentum (PureBf16): computed in float, each
/// value rounded to P once per step.
template <class P, class G>
  requires(std::same_as<P, half> || std::same_as<P, bfloat16>) && FloatElement<G>
void sgd_update(std::span<P> param, std::span<const G> grad, std::span<P> momentum_buffer, const SgdConfig& config,
                std::int64_t step, double grad_scale = 1.0) {
  detail::check_sgd_sizes(param.size(), grad.size(), momentum_buffer.size(), config);
  detail::update_widened<P>(
      param.size(),
      [&](std::size_t begin, std::span<float> p, std::span<float> buffer) {
        sgd_update<float, G>(p, grad.subspan(begin, p.size()), buffer, config, step, grad_scale);
      },
      param, momentum_buffer);
}

/// sgd_update() for gradients in a mutable span (Tensor::span() gives one), which template
/// deduction would not convert to std::span<const G>.
template <class P, class G>
  requires FloatElement<P> && FloatElement<G>
void sgd_update(std::span<P> param, std::span<G> grad, std::span<P> momentum_buffer, const SgdConfig& config,
                std::int64_t step, double grad_scale = 1.0) {
  sgd_update<P, G>(param, std::span<const G>(grad), momentum_buffer, config, step, grad_scale);
}

/// SGD over one flat parameter span of a fixed size, owning its momentum buffer when momentum
/// is nonzero (numel * sizeof(P) bytes, counted as MemoryCategory::OptimizerState).
///   step(params, grads[, grad_scale])  one step; grads of any FloatElement type, each times
///                        grad_scale first (sgd_update); throws polyshard::Error naming the
///                        optimizer and the sizes when they differ from numel;
///   step_count(), set_step_count(n), lr(), set_lr(x), config(), numel(), state_bytes(),
///   state(): {"momentum_buffer"} (nothing without momentum), sharing storage with the optimizer.
template <class P>
class Sgd {
 public:
  using param_type = P;
  using config_type = SgdConfig;

  /// config: hyperparameters; numel: size of the parameter span every step() receives.
  Sgd(SgdConfig config, std::size_t numel) : config_(config), numel_(numel) {
    detail::validate(config, "Sgd");
    if (config.momentum != 0) {
      momentum_buffer_ =
          Tensor<P>::zeros(Shape{static_cast<std::int64_t>(numel)}, MemoryCategory::OptimizerState);
    }
  }

  template <class G>
    requires FloatElement<G>
  void step(std::span<P> params, std::span<const G> grads, double grad_scale = 1.0) {
    POLYSHARD_CHECK(params.size() == numel_ && grads.size() == numel_, "Sgd::step: built for ", numel_,
                    " elements, got params of ", params.size(), " and grads of ", grads.size());
    const std::span<P> buffer = momentum_buffer_.defined() ? momentum_buffer_.span() : std::span<P>{};
    sgd_update<P, G>(params, grads, buffer, config_, step_ + 1, grad_scale);
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
    POLYSHARD_CHECK(params.size() == numel_ && grads.size() == numel_, "Sgd::step: built for ", numel_,
                    " elements, got params of ", params.size(), " and grads of ", grads.size());
    const std::span<P> buffer = momentum_buffer_.defined() ? momentum_buffer_.span() : std::span<P>{};
    sgd_update<G, C>(params, grads, buffer, config_, step_ + 1, compute, grad_scale);
    ++step_;
  }

  std::int64_t step_count() const { return step_; }
  /// Restores the step counter with the state from a checkpoint (step 0 restarts the buffer).
  void set_step_count(std::int64_t step) {
    POLYSHARD_CHECK(step >= 0, "Sgd::set_step_count: negative step ", step);
    step_ = step;
  }
  double lr() const { return config_.lr; }
  void set_lr(double lr) {
    POLYSHARD_CHECK(lr >= 0, "Sgd::set_lr: invalid learning rate ", lr);
    config_.lr = lr;
  }
  const SgdConfig& config() const { return config_; }
  std::size_t numel() const { return numel_; }
  std::size_t state_bytes() const { return momentum_buffer_.defined() ? momentum_buffer_.bytes() : 0; }
  /// The state tensors by PyTorch's names. They share storage with the optimizer: a checkpoint
  /// reads them, a restore copies into them (Tensor::copy_from) and calls set_step_count().
  std::vector<std::pair<std::string, Tensor<P>>> state() const {
    if (!momentum_buffer_.defined()) return {};
    return {{"momentum_buffer", momentum_buffer_}};
  }

 private:
  SgdConfig config_;
  std::size_t numel_;
  Tensor<P> momentum_buffer_;  // (numel,) when momentum != 0, else undefined
  std::int64_t step_ = 0;
};

}  // namespace polyshard
