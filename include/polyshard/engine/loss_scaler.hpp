// The loss scaler of a precision policy: the factor the loss is multiplied by before backward,
// and how it reacts to overflowing gradients.
#pragma once

#include <algorithm>

#include "polyshard/core/error.hpp"
#include "polyshard/policy/config.hpp"
#include "polyshard/policy/precision.hpp"

namespace polyshard {

/// The numbers a loss scaler follows: its Scale policy's, with those StrategyConfig sets at run
/// time (a static or absent scale has window 1, hysteresis 1 and no back-off).
struct LossScaleRule {
  double initial_scale = 1;
  int window = 1;
  int hysteresis = 1;
  double min_scale = 1;
  double backoff = 1;
  bool consecutive_hysteresis = false;
};

/// Runtime state of `Scale` (NoLossScale, StaticLossScale, DynamicLossScale: DeepSpeed's rules,
/// or GradScalerLossScale: PyTorch's; see policy/precision.hpp for each rule in words). On
/// overflow the step is skipped; a dynamic scale backs off once the hysteresis is spent (one
/// unit per overflow, never restored by the back-off itself), never below min_scale; after
/// `window` consecutive good steps it doubles and the hysteresis is restored.
template <class Scale>
class LossScaler {
 public:
  /// Scale's rule as its template arguments give it; `static_override` > 0 makes it static.
  explicit LossScaler(double static_override = 0) : LossScaler(StrategyConfig{.loss_scale = static_override}) {}
  /// Scale's rule with the loss-scale settings of `config` (loss_scale, initial_scale_power,
  /// loss_scale_window, hysteresis, min_loss_scale); a setting Scale has no use for is refused,
  /// naming it, rather than ignored.
  explicit LossScaler(const StrategyConfig& config)
      : rule_(rule_of(config)),
        scale_(config.loss_scale > 0 ? config.loss_scale : rule_.initial_scale),
        dynamic_(Scale::dynamic && config.loss_scale <= 0),
        hysteresis_left_(rule_.hysteresis) {}

  double scale() const { return scale_; }
  bool scaled() const { return Scale::scaled; }
  const LossScaleRule& rule() const { return rule_; }

  /// Records the outcome of a step; returns true when the step may be applied.
  bool update(bool overflow) {
    if (!overflow) {
      if (dynamic_) {
        if (rule_.consecutive_hysteresis) hysteresis_left_ = rule_.hysteresis;
        if (++good_steps_ >= rule_.window) {
          scale_ *= 2;
          good_steps_ = 0;
          hysteresis_left_ = rule_.hysteresis;
        }
      }
      return true;
    }
    ++skipped_;
    good_steps_ = 0;
    if (dynamic_) {
      if (hysteresis_left_ > 1) --hysteresis_left_;
      else scale_ = std::max(scale_ * rule_.backoff, rule_.min_scale);
    }
    return false;
  }

  std::int64_t skipped_steps() const { return skipped_; }
  int hysteresis_left() const { return hysteresis_left_; }
  int good_steps() const { return good_steps_; }

  /// Restores the state saved by a checkpoint.
  void restore(double scale, int good_steps, int hysteresis_left, std::int64_t skipped) {
    scale_ = scale;
    good_steps_ = good_steps;
    hysteresis_left_ = hysteresis_left;
    skipped_ = skipped;
  }

 private:
  static LossScaleRule rule_of(const StrategyConfig& c) {
    POLYSHARD_CHECK(c.loss_scale >= 0, "StrategyConfig::loss_scale = ", c.loss_scale,
                    ": must be 0 (dynamic) or a positive static scale");
    // The first dynamic-scaling setting that is set, for the messages below.
    const char* set = c.initial_scale_power ? "initial_scale_power"
                      : c.loss_scale_window ? "loss_scale_window"
                      : c.hysteresis        ? "hysteresis"
                      : c.min_loss_scale    ? "min_loss_scale"
                                            : nullptr;
    if constexpr (!Scale::scaled) {
      POLYSHARD_CHECK(c.loss_scale == 0 && set == nullptr, "StrategyConfig::", set ? set : "loss_scale",
                      " is set, but this strategy's precision policy scales no loss (loss scaling protects fp16 "
                      "gradients; bf16 and fp32 need none): leave it unset, or choose an fp16 precision policy");
      return {};
    } else if constexpr (!Scale::dynamic) {
      POLYSHARD_CHECK(set == nullptr, "StrategyConfig::", set, " is set, but this strategy's loss scale is static "
                      "(StaticLossScale): it applies to a dynamic scale only");
      return {.initial_scale = Scale::initial_scale};
    } else {
      POLYSHARD_CHECK(set == nullptr || c.loss_scale == 0, "StrategyConfig::", set, " applies to a dynamic loss "
                      "scale, and loss_scale = ", c.loss_scale, " makes it static: set one or the other");
      if constexpr (!Scale::hysteresis_and_floor) {
        POLYSHARD_CHECK(!c.hysteresis && !c.min_loss_scale, "StrategyConfig::",
                        c.hysteresis ? "hysteresis" : "min_loss_scale", " is set, but this strategy scales the "
                        "loss as PyTorch's GradScaler (GradScalerLossScale), which halves at every overflow and "
                        "has no floor: it belongs to DeepSpeed's scaler (DynamicLossScale)");
      }
      LossScaleRule r{.initial_scale = Scale::initial_scale, .window = Scale::window, .hysteresis = Scale::hysteresis,
                      .min_scale = Scale::min_scale, .backoff = Scale::backoff,
                      .consecutive_hysteresis = Scale::consecutive_hysteresis};
      if (c.initial_scale_power) {
        POLYSHARD_CHECK(*c.initial_scale_power >= 0 && *c.initial_scale_power < 63,
                        "StrategyConfig::initial_scale_power = ", *c.initial_scale_power, ": must lie in [0, 63)");
        r.initial_scale = static_cast<double>(1ull << *c.initial_scale_power);
      }
      if (c.loss_scale_window) {
        POLYSHARD_CHECK(*c.loss_scale_window >= 1, "StrategyConfig::loss_scale_window = ", *c.loss_scale_window,
                        ": must be at least 1");
        r.window = *c.loss_scale_window;
      }
      if (c.hysteresis) {
        POLYSHARD_CHECK(*c.hysteresis >= 1, "StrategyConfig::hysteresis = ", *c.hysteresis, ": must be at least 1");
        r.hysteresis = *c.hysteresis;
      }
      if (c.min_loss_scale) {
        POLYSHARD_CHECK(*c.min_loss_scale > 0, "StrategyConfig::min_loss_scale = ", *c.min_loss_scale,
                        ": must be positive");
        r.min_scale = *c.min_loss_scale;
      }
      return r;
    }
  }

  LossScaleRule rule_;
  double scale_;
  bool dynamic_;
  int good_steps_ = 0;
  int hysteresis_left_;
  std::int64_t skipped_ = 0;
};

}  // namespace polyshard
