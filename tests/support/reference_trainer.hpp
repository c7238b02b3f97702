// The oracle outside the engine: a trainer that shares nothing with polyshard's Engine, its
// strategies, optimizers or communicators, only the model and autograd. It holds the whole model
// in double on one process, computes the gradient of the global batch's mean loss, and applies
// the optimizer's update as PyTorch documents it (torch.optim.SGD, Adam and AdamW, written out in
// double in tests/optim/reference.hpp, and torch.nn.utils.clip_grad_norm_).
//
// A precision policy's roundings are emulated where they change the result: the model computes
// with the master weights rounded to the compute dtype, the gradient is rounded to the reduce
// dtype (after multiplying by the loss scale, as the scaled gradient is what is cast), and the
// master weights and the optimizer's state are rounded to the master dtype after each update.
// Everything else is exact to double, so a strategy's difference from this trainer is its own
// rounding, bounded by the tolerances the tests state.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "polyshard/autograd/backward.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/data/data.hpp"
#include "polyshard/nn/nn.hpp"
#include "optim/reference.hpp"
#include "polyshard/optim/config.hpp"

namespace polyshard::test {

/// `x` rounded to the nearest value of element type X, as a double.
template <class X>
double round_to(double x) {
  return static_cast<double>(static_cast<float>(static_cast<X>(static_cast<float>(x))));
}
template <>
inline double round_to<double>(double x) {
  return x;
}

/// The largest finite value of element type X.
template <class X>
constexpr double largest_finite() {
  if constexpr (std::is_same_v<X, half>) return 65504.0;                       // (2 - 2^-10) * 2^15
  else if constexpr (std::is_same_v<X, bfloat16>) return 3.3895313892515355e38;  // (2 - 2^-7) * 2^127
  else return static_cast<double>(std::numeric_limits<X>::max());
}

/// The optimizer the reference applies: SGD, Adam (coupled L2 decay) or AdamW (decoupled).
using ReferenceOptimizer = std::variant<SgdConfig, AdamConfig, AdamWConfig>;

/// What the precision policy rounds, as functions (identity for double).
struct ReferenceRounding {
  double (*compute)(double) = &round_to<float>;  // the weights the model computes with
  double (*reduce)(double) = &round_to<float>;   // the (scaled) gradient that is reduced
  double (*master)(double) = &round_to<float>;   // the weights the optimizer updates, and its state
  double loss_scale = 1.0;                        // the scale the reduced gradient carries
  double reduce_max = std::numeric_limits<float>::max();  // the reduce dtype's largest finite value

  template <class Compute, class Reduce, class Master>
  static ReferenceRounding of(double loss_scale = 1.0) {
    return {&round_to<Compute>, &round_to<Reduce>, &round_to<Master>, loss_scale,
            largest_finite<Reduce>()};
  }
};

class ReferenceTrainer {
 public:
  /// The model of `config` initialised as polyshard initialises it from `seed` (each
  /// parameter's values a function of the seed, its name and index, drawn in float).
  ReferenceTrainer(const GptConfig& config, std::uint64_t seed, ReferenceOptimizer optimizer,
                   ReferenceRounding rounding)
      : model_(config), flat_(model_), rounding_(rounding) {
    Gpt<float> drawn_model(config);
    FlatParameters<float> drawn(drawn_model);
    drawn.initialize(seed);
    const auto values = drawn.values().to_vector();
    std::vector<double> master(static_cast<std::size_t>(flat_.numel()));
    for (std::size_t i = 0; i < master.size(); ++i) master[i] = rounding_.master(double(values[i]));
    std::visit(
        [&](const auto& c) {
          using C = std::decay_t<decltype(c)>;
          if constexpr (std::is_same_v<C, SgdConfig>) optimizer_ = ReferenceSgd{c, std::move(master), {}};
          else
            optimizer_ =
                ReferenceAdam{static_cast<AdamConfig>(c), std::is_same_v<C, AdamWConfig>, std::move(master), {}, {}};
        },
        optimizer);
  }

  /// One step on the whole global batch with learning rate `lr`, clipping the gradient's norm
  /// to `max_norm`. Returns the batch's mean loss, computed before the update.
  double step(const Batch& global, double lr, double max_norm = std::numeric_limits<double>::infinity()) {
    std::vector<double>& master = weights_of(optimizer_);
    const std::size_t n = master.size();
    compute_with(master);
    flat_.zero_grad(false);
    Var<double> loss = model_.loss(global.inputs, global.targets);
    backward(loss);
    const double value = loss.value().data()[0];

    // The reduced gradient: scaled, rounded to the reduce dtype, unscaled.
    const double* const raw = flat_.grads().data();
    std::vector<double> grad(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double scaled = raw[i] * rounding_.loss_scale;
      if (std::abs(scaled) > rounding_.reduce_max) overflowed_ = true;
      grad[i] = rounding_.reduce(scaled) / rounding_.loss_scale;
    }
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
    double squares = 0;
    for (double g : grad) squares += g * g;
    last_grad_norm_ = std::sqrt(squares);
    const double coefficient = max_norm / (last_grad_norm_ + 1e-6);
    if (coefficient < 1.0)
      for (double& g : grad) g *= coefficient;
    largest_abs_grad_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      largest_abs_grad_[i] = std::max(largest_abs_grad_[i], std::abs(grad[i]));
    }

    if (delay_) {  // this step's gradient waits for the next step; the previous one's applies now
      std::optional<std::pair<std::vector<double>, double>> previous = std::move(pending_);
      pending_.emplace(std::move(grad), lr);
      if (previous) update(previous->first, previous->second);
      return value;
    }
    update(grad, lr);
    return value;
  }

  /// ZeRO-Offload's delayed parameter update: from now on each step applies the gradient of the
  /// step before it (at that step's learning rate) and keeps its own for the next.
  void delay_updates() { delay_ = true; }
  /// Applies the gradient a delayed step kept, if any.
  void flush() {
    if (!pending_) return;
    update(pending_->first, pending_->second);
    pending_.reset();
  }

  /// The master weights by parameter name, in the order polyshard's FlatParameters lays them out.
  std::vector<std::pair<std::string, std::vector<double>>> parameters() const {
    return by_name(std::visit([](const auto& r) -> const std::vector<double>& { return r.p; }, optimizer_));
  }
  /// Each element's largest |gradient| (reduced, after clipping) over the steps so far, by name.
  std::vector<std::pair<std::string, std::vector<double>>> largest_abs_grads() const {
    std::vector<double> values = largest_abs_grad_;
    values.resize(static_cast<std::size_t>(flat_.numel()));  // zeros before the first step
    return by_name(values);
  }
  /// The mean loss of `global` at master weights `masters` (by name, as parameters() gives them),
  /// computed as step() computes it: the weights rounded to the compute dtype, the rest in double.
  /// Leaves this trainer's own weights and state as they were.
  template <class Named>
  double loss_at(const Named& masters, const Batch& global) {
    std::vector<double> master(static_cast<std::size_t>(flat_.numel()));
    for (const auto& e : flat_.entries()) {
      const auto it = masters.find(e.name);
      if (it == masters.end() || it->second.size() != static_cast<std::size_t>(e.numel()))
        throw std::invalid_argument("ReferenceTrainer::loss_at: no weights of the right size for " + e.name);
      std::copy(it->second.begin(), it->second.end(), master.begin() + e.offset);
    }
    return loss_of(master, global);
  }
  /// loss_at() this trainer's own master weights: the loss of a batch drawn and not trained on.
  double loss(const Batch& global) { return loss_of(weights_of(optimizer_), global); }
  /// True when a scaled gradient exceeded the reduce dtype's range (the engine skips that step;
  /// this trainer does not, so a comparison past it means nothing).
  bool overflowed() const { return overflowed_; }
  double last_grad_norm() const { return last_grad_norm_; }

 private:
  /// The model's weights: the masters in the compute dtype.
  void compute_with(const std::vector<double>& master) {
    double* const weights = flat_.values().data();
    for (std::size_t i = 0; i < master.size(); ++i) weights[i] = rounding_.compute(master[i]);
  }
  double loss_of(const std::vector<double>& master, const Batch& global) {
    compute_with(master);
    return model_.loss(global.inputs, global.targets).value().data()[0];
  }
  std::vector<std::pair<std::string, std::vector<double>>> by_name(const std::vector<double>& flat) const {
    std::vector<std::pair<std::string, std::vector<double>>> out;
    for (const auto& e : flat_.entries())
      out.emplace_back(e.name, std::vector<double>(flat.begin() + e.offset, flat.begin() + e.offset + e.numel()));
    return out;
  }
  static std::vector<double>& weights_of(std::variant<ReferenceSgd, ReferenceAdam>& optimizer) {
    return std::visit([](auto& r) -> std::vector<double>& { return r.p; }, optimizer);
  }
  static std::vector<std::vector<double>*> state_of(ReferenceSgd& r) { return {&r.p, &r.b}; }
  static std::vector<std::vector<double>*> state_of(ReferenceAdam& r) { return {&r.p, &r.m, &r.v}; }

  /// torch.optim's update (tests/optim/reference.hpp), then the masters and the optimizer's
  /// state rounded to the master dtype, which holds both.
  void update(const std::vector<double>& grad, double lr) {
    std::visit(
        [&](auto& reference) {
          reference.c.lr = lr;
          reference.step(grad);
          for (std::vector<double>* values : state_of(reference))
            for (double& x : *values) x = rounding_.master(x);
        },
        optimizer_);
  }

  Gpt<double> model_;
  FlatParameters<double> flat_;
  std::variant<ReferenceSgd, ReferenceAdam> optimizer_;  // the master weights and the optimizer's state
  ReferenceRounding rounding_;
  bool overflowed_ = false;
  bool delay_ = false;
  std::optional<std::pair<std::vector<double>, double>> pending_;  // a delayed gradient and its lr
  double last_grad_norm_ = 0;
  std::vector<double> largest_abs_grad_;  // per element, over the steps so far
};

}  // namespace polyshard::test
