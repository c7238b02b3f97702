// AnyOptimizer: SGD, Adam or AdamW chosen at run time (a command-line flag, say), behind the
// same interface as each of them, so one engine instantiation serves all three.
#pragma once

#include <optional>
#include <variant>

#include "polyshard/optim/adam.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/optim/sgd.hpp"

namespace polyshard {

/// The configuration of one of the three optimizers.
using AnyOptimizerConfig = std::variant<SgdConfig, AdamConfig, AdamWConfig>;

/// The alternative `c` holds, with weight_decay 0 (the config of parameters exempt from decay).
inline std::optional<AnyOptimizerConfig> without_weight_decay(const AnyOptimizerConfig& c) {
  return std::visit([](const auto& x) -> std::optional<AnyOptimizerConfig> { return *without_weight_decay(x); }, c);
}

/// One of Sgd<P>, Adam<P>, AdamW<P>, selected by the alternative its config holds.
template <class P>
class AnyOptimizer {
 public:
  using param_type = P;
  using config_type = AnyOptimizerConfig;

  AnyOptimizer(const AnyOptimizerConfig& config, std::size_t numel)
      : impl_(std::visit(
            [numel](const auto& c) -> Impl {
              using C = std::decay_t<decltype(c)>;
              if constexpr (std::is_same_v<C, SgdConfig>) return Impl(std::in_place_type<Sgd<P>>, c, numel);
              else if constexpr (std::is_same_v<C, AdamConfig>) return Impl(std::in_place_type<Adam<P>>, c, numel);
              else return Impl(std::in_place_type<AdamW<P>>, c, numel);
            },
            config)) {}

  template <class G>
    requires FloatElement<G>
  void step(std::span<P> params, std::span<const G> grads, double grad_scale = 1.0) {
    std::visit([&](auto& o) { o.step(params, grads, grad_scale); }, impl_);
  }
  template <class G>
    requires FloatElement<G>
  void step(std::span<P> params, std::span<G> grads, double grad_scale = 1.0) {
    step(params, std::span<const G>(grads), grad_scale);
  }
  /// step() over fp32 masters that also writes the 16-bit compute copy in the same pass.
  template <class G, class C>
    requires std::same_as<P, float> && FloatElement<G> && (std::same_as<C, half> || std::same_as<C, bfloat16>)
  void step(std::span<P> params, std::span<const G> grads, std::span<C> compute, double grad_scale = 1.0) {
    std::visit([&](auto& o) { o.step(params, grads, compute, grad_scale); }, impl_);
  }

  std::int64_t step_count() const { return std::visit([](const auto& o) { return o.step_count(); }, impl_); }
  void set_step_count(std::int64_t n) { std::visit([n](auto& o) { o.set_step_count(n); }, impl_); }
  double lr() const { return std::visit([](const auto& o) { return o.lr(); }, impl_); }
  void set_lr(double lr) { std::visit([lr](auto& o) { o.set_lr(lr); }, impl_); }
  std::size_t numel() const { return std::visit([](const auto& o) { return o.numel(); }, impl_); }
  std::size_t state_bytes() const { return std::visit([](const auto& o) { return o.state_bytes(); }, impl_); }
  std::vector<std::pair<std::string, Tensor<P>>> state() const {
    return std::visit([](const auto& o) { return o.state(); }, impl_);
  }
  /// State values kept per parameter (Adam: 2; SGD: 1 with momentum, else 0).
  int states_per_param() const {
    return static_cast<int>(state_bytes() / std::max<std::size_t>(numel() * sizeof(P), 1));
  }

 private:
  using Impl = std::variant<Sgd<P>, Adam<P>, AdamW<P>>;
  Impl impl_;
};

}  // namespace polyshard
