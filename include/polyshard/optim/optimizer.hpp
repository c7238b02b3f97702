// The Optimizer concept: what the engine needs from Sgd, Adam, AdamW and any optimizer added later.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// An optimizer over one flat parameter span of a fixed size. Required members:
///   param_type                 the master element type P (float or double);
///   config_type                its hyperparameter struct;
///   step(span<P>, span<const P>)  one update (a model's grads may also be 16-bit: step is a
///                              template over the gradient type in every polyshard optimizer);
/// and optionally step(params, grads, double grad_scale), every gradient times grad_scale as it
/// is read (1 / loss scale times a clipping coefficient). polyshard's optimizers have it; the
/// engine scales the gradients in place first for one that does not.
///   step_count(), set_step_count(n)  steps taken, restorable from a checkpoint;
///   lr(), set_lr(x)            the learning rate, for schedules;
///   numel()                    the span size it was built for;
///   state_bytes()              bytes of optimizer state it owns;
///   state()                    its state tensors by PyTorch's names, sharing its storage.
template <class O>
concept Optimizer = requires(O& o, const O& co, std::span<typename O::param_type> params,
                             std::span<const typename O::param_type> grads, std::int64_t step, double lr) {
  typename O::config_type;
  o.step(params, grads);
  { co.step_count() } -> std::same_as<std::int64_t>;
  o.set_step_count(step);
  { co.lr() } -> std::convertible_to<double>;
  o.set_lr(lr);
  { co.numel() } -> std::same_as<std::size_t>;
  { co.state_bytes() } -> std::same_as<std::size_t>;
  { co.state() } -> std::same_as<std::vector<std::pair<std::string, Tensor<typename O::param_type>>>>;
};

/// The optimizer that updates spans in the memory of device D for the optimizer type Opt an
/// engine was given: Opt itself on the host; a device's header specializes it
/// (polyshard/optim/cuda/fused_optimizer.hpp: the fused CUDA kernels behind Opt's interface).
template <class Opt, class D>
struct optimizer_on {
  static_assert(std::same_as<D, Cpu>,
                "no optimizer for this device: include its header (polyshard/optim/cuda/fused_optimizer.hpp for Cuda)");
  using type = Opt;
};
template <class Opt, class D>
using optimizer_on_t = typename optimizer_on<Opt, D>::type;

}  // namespace polyshard
