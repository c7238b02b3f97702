// An optimizer over spans in device memory: the configuration, step counter and state (by
// PyTorch's names) of Sgd, Adam, AdamW or AnyOptimizer, updated by the fused CUDA kernels. An
// engine computing on Cuda holds one per unit where a host engine holds the host optimizer.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "polyshard/core/cuda/current_stream.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/optim/config.hpp"
#include "polyshard/optim/cuda/fused_optimizers.hpp"
#include "polyshard/optim/optimizer.hpp"
#include "polyshard/tensor/cuda/storage.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard::cuda {

/// Host optimizer type Opt (Sgd<float>, Adam<float>, AdamW<float>, AnyOptimizer<float>) on
/// device memory: built from Opt's configuration and a span size, stepped on spans of device
/// memory (fp32 master weights, gradients of float, half or bfloat16), its state tensors on the
/// device. Each step is one fused launch on the thread's current stream; an update agrees with
/// Opt's on the host to the rounding of the operations the kernels document.
template <class Opt>
class FusedOptimizer {
  static_assert(std::same_as<typename Opt::param_type, float>,
                "FusedOptimizer: the fused kernels update fp32 master weights: use the optimizer over float");

 public:
  using param_type = float;
  using config_type = typename Opt::config_type;

  FusedOptimizer(const config_type& config, std::size_t numel) : config_(config), numel_(numel) {
    (void)Opt(config, 0);  // the host optimizer validates the configuration (and allocates nothing)
    const auto n = static_cast<std::int64_t>(numel);
    std::visit(
        [&](const auto& c) {
          using C = std::decay_t<decltype(c)>;
          if constexpr (std::is_same_v<C, SgdConfig>) {
            if (c.momentum != 0) state_.emplace_back("momentum_buffer", zeros(n));
          } else {
            state_.emplace_back("exp_avg", zeros(n));
            state_.emplace_back("exp_avg_sq", zeros(n));
          }
        },
        config_);
  }

  /// One update of `params` (device memory) from `grads` (device memory), each gradient times
  /// `grad_scale` on the fly (1 / loss scale times a clipping coefficient; 1: none).
  template <class G>
    requires(std::same_as<G, float> || std::same_as<G, half> || std::same_as<G, bfloat16>)
  void step(std::span<float> params, std::span<const G> grads, float grad_scale = 1.0f) {
    // No compute copy: G's own type stands in for its type, as the kernels are instantiated.
    launch<G, G>(params, grads, nullptr, grad_scale);
  }
  template <class G>
  void step(std::span<float> params, std::span<G> grads, float grad_scale = 1.0f) {
    step(params, std::span<const G>(grads), grad_scale);
  }
  /// step(), also writing the updated weights rounded to P (nearest even) into `compute`
  /// (device memory, as long as params) in the same pass: the compute-type copy a strategy
  /// would otherwise cast from the masters after the step. (G, P): (float, bfloat16),
  /// (float, half), (bfloat16, bfloat16), (half, half), as the precision policies compose them.
  template <class G, class P>
    requires(std::same_as<P, half> || std::same_as<P, bfloat16>)
  void step(std::span<float> params, std::span<const G> grads, std::span<P> compute, float grad_scale = 1.0f) {
    POLYSHARD_CHECK(compute.size() == params.size(), "FusedOptimizer::step: the compute copy has ", compute.size(),
                    " elements, the parameters ", params.size());
    launch<G, P>(params, grads, compute.data(), grad_scale);
  }

  std::int64_t step_count() const { return step_; }
  void set_step_count(std::int64_t step) {
    POLYSHARD_CHECK(step >= 0, "FusedOptimizer::set_step_count: negative step ", step);
    step_ = step;
  }
  double lr() const {
    return std::visit([](const auto& c) { return static_cast<double>(c.lr); }, config_);
  }
  void set_lr(double lr) {
    POLYSHARD_CHECK(lr >= 0, "FusedOptimizer::set_lr: invalid learning rate ", lr);
    std::visit([lr](auto& c) { c.lr = lr; }, config_);
  }
  std::size_t numel() const { return numel_; }
  std::size_t state_bytes() const {
    std::size_t bytes = 0;
    for (const auto& [name, t] : state_) bytes += t.bytes();
    return bytes;
  }
  /// State values kept per parameter (Adam: 2; SGD: 1 with momentum, else 0).
  int states_per_param() const { return static_cast<int>(state_.size()); }
  /// The state tensors (device memory) by PyTorch's names, sharing storage with the optimizer.
  std::vector<std::pair<std::string, Tensor<float, Cuda>>> state() const { return state_; }

 private:
  template <class G, class P>
  void launch(std::span<float> params, std::span<const G> grads, P* compute, float grad_scale) {
    POLYSHARD_CHECK(params.size() == numel_ && grads.size() == numel_, "FusedOptimizer::step: built for ", numel_,
                    " elements, got params of ", params.size(), " and grads of ", grads.size());
    const std::int64_t next = step_ + 1;
    const cudaStream_t stream = current_stream();
    std::visit(
        [&](const auto& c) {
          using C = std::decay_t<decltype(c)>;
          if constexpr (std::is_same_v<C, SgdConfig>) {
            float* momentum = state_.empty() ? nullptr : state_[0].second.data();
            fused_sgd_step<G, P>(params.data(), grads.data(), momentum, compute, numel_, c, next, grad_scale, stream);
          } else {
            fused_adam_step<G, P>(params.data(), grads.data(), state_[0].second.data(), state_[1].second.data(),
                                  compute, numel_, static_cast<AdamConfig>(c), next, std::is_same_v<C, AdamWConfig>,
                                  grad_scale, stream);
          }
        },
        config_);
    step_ = next;
  }

  static Tensor<float, Cuda> zeros(std::int64_t n) {
    return Tensor<float, Cuda>::zeros({n}, MemoryCategory::OptimizerState);
  }

  std::variant<SgdConfig, AdamConfig, AdamWConfig> config_;
  std::size_t numel_;
  std::int64_t step_ = 0;
  std::vector<std::pair<std::string, Tensor<float, Cuda>>> state_;
};

}  // namespace polyshard::cuda

namespace polyshard {
/// An engine computing on Cuda updates its units with the fused kernels.
template <class Opt>
struct optimizer_on<Opt, Cuda> {
  using type = cuda::FusedOptimizer<Opt>;
};
}  // namespace polyshard
