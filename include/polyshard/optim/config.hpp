// Hyperparameters of the optimizers, as plain structs with PyTorch's names and defaults.
#pragma once

#include <cmath>
#include <optional>

#include "polyshard/core/error.hpp"

namespace polyshard {

/// Hyperparameters of SGD, with torch.optim.SGD's names and defaults (except `lr`, which
/// PyTorch requires and polyshard defaults to 1e-3).
///   lr            step size (>= 0);
///   momentum      momentum factor; 0 keeps no momentum buffer;
///   dampening     the buffer adds (1 - dampening) * grad from the second step on;
///   weight_decay  L2 penalty added to the gradient (coupled, as in PyTorch);
///   nesterov      Nesterov momentum; needs momentum > 0 and dampening == 0, as in PyTorch.
struct SgdConfig {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

/// Hyperparameters of Adam, with torch.optim.Adam's names and defaults.
///   lr            step size (>= 0);
///   beta1, beta2  decay rates of the first and second moment estimates, in [0, 1);
///   eps           added to the bias-corrected sqrt of the second moment (outside the root);
///   weight_decay  Adam: L2 penalty added to the gradient; AdamW: decoupled decay of the weights.
struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
};

/// AdamConfig with torch.optim.AdamW's default weight decay of 1e-2. A separate struct, not a
/// factory, so designated initializers (`AdamWConfig{.lr = 3e-4}`) keep AdamW's default.
struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;

  /// The same values as the AdamConfig that adam_update() takes.
  operator AdamConfig() const { return {lr, beta1, beta2, eps, weight_decay}; }
};

/// `c` with weight_decay 0: the config of the parameters exempt from weight decay (PyTorch's
/// parameter group with weight_decay=0). Nothing for a config that has no weight_decay.
template <class C>
std::optional<C> without_weight_decay(const C& c) {
  if constexpr (requires(C& x) { x.weight_decay = 0.0; }) {
    C out = c;
    out.weight_decay = 0;
    return out;
  } else {
    return std::nullopt;
  }
}

namespace detail {

// PyTorch's constructor checks, with the optimizer's name in the message.
inline void validate(const SgdConfig& c, const char* who) {
  POLYSHARD_CHECK(c.lr >= 0, who, ": invalid learning rate ", c.lr);
  POLYSHARD_CHECK(c.momentum >= 0, who, ": invalid momentum ", c.momentum);
  POLYSHARD_CHECK(c.weight_decay >= 0, who, ": invalid weight_decay ", c.weight_decay);
  POLYSHARD_CHECK(!c.nesterov || (c.momentum > 0 && c.dampening == 0), who,
                  ": Nesterov momentum requires a momentum and zero dampening (momentum ", c.momentum,
                  ", dampening ", c.dampening, ")");
}

inline void validate(const AdamConfig& c, const char* who) {
  POLYSHARD_CHECK(c.lr >= 0, who, ": invalid learning rate ", c.lr);
  POLYSHARD_CHECK(c.eps >= 0, who, ": invalid epsilon ", c.eps);
  POLYSHARD_CHECK(0 <= c.beta1 && c.beta1 < 1, who, ": invalid beta1 ", c.beta1, " (must be in [0, 1))");
  POLYSHARD_CHECK(0 <= c.beta2 && c.beta2 < 1, who, ": invalid beta2 ", c.beta2, " (must be in [0, 1))");
  POLYSHARD_CHECK(c.weight_decay >= 0, who, ": invalid weight_decay ", c.weight_decay);
}

/// The multiplier every gradient takes on its way into an update (1 / loss scale times a
/// clipping coefficient): a scale that is not finite would turn a whole step into inf or NaN.
inline void check_grad_scale(const char* who, double grad_scale) {
  POLYSHARD_CHECK(std::isfinite(grad_scale), who, ": the gradient scale ", grad_scale, " is not finite");
}

}  // namespace detail
}  // namespace polyshard
