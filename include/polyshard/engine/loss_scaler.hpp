// The loss scaler of a precision policy: the factor the loss is multiplied by before backward,
// and how it reacts to overflowing gradients.
#pragma once

#include <algorithm>

#include "polyshard/policy/precision.hpp"

namespace polyshard {

/// Runtime state of `Scale` (NoLossScale, StaticLossScale, DynamicLossScale: DeepSpeed's rules,
/// or GradScalerLossScale: PyTorch's; see policy/precision.hpp for each rule in words). On
/// overflow the step is skipped; a dynamic scale backs off once the hysteresis is spent (one
/// unit per overflow, never restored by the back-off itself), never below min_scale; after
/// `window` consecutive good steps it doubles and the hysteresis is restored.
template <class Scale>
class LossScaler {
 public:
  explicit LossScaler(double static_override = 0) : scale_(static_override > 0 ? static_override : Scale::initial_scale),
                                                   dynamic_(Scale::dynamic && static_override <= 0) {}

  double scale() const { return scale_; }
  bool scaled() const { return Scale::scaled; }

  /// Records the outcome of a step; returns true when the step may be applied.
  bool update(bool overflow) {
    if (!overflow) {
      if (dynamic_) {
        if (consecutive_hysteresis()) hysteresis_left_ = hysteresis();
        if (++good_steps_ >= window()) {
          scale_ *= 2;
          good_steps_ = 0;
          hysteresis_left_ = hysteresis();
        }
      }
      return true;
    }
    ++skipped_;
    good_steps_ = 0;
    if (dynamic_) {
      if (hysteresis_left_ > 1) --hysteresis_left_;
      else scale_ = std::max(scale_ * backoff(), min_scale());
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
  static constexpr int window() {
    if constexpr (Scale::dynamic) return Scale::window; else return 1;
  }
  static constexpr int hysteresis() {
    if constexpr (Scale::dynamic) return Scale::hysteresis; else return 1;
  }
  static constexpr double min_scale() {
    if constexpr (Scale::dynamic) return Scale::min_scale; else return 1;
  }
  static constexpr double backoff() {
    if constexpr (Scale::dynamic) return Scale::backoff; else return 1;
  }
  static constexpr bool consecutive_hysteresis() {
    if constexpr (Scale::dynamic) return Scale::consecutive_hysteresis; else return false;
  }

  double scale_;
  bool dynamic_;
  int good_steps_ = 0;
  int hysteresis_left_ = hysteresis();
  std::int64_t skipped_ = 0;
};

}  // namespace polyshard
