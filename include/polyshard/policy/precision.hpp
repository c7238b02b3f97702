// PrecisionPolicy: the dtypes of compute, gradient reduction and master weights, and the loss
// scaling that keeps fp16 gradients from underflowing.
#pragma once

#include <type_traits>

#include "polyshard/core/dtype.hpp"
#include "polyshard/policy/family.hpp"

namespace polyshard {

/// No loss scaling.
struct NoLossScale {
  static constexpr bool scaled = false;
  static constexpr bool dynamic = false;
  static constexpr double initial_scale = 1.0;
};

/// A fixed loss scale (DeepSpeed's loss_scale > 0).
template <int Power>
struct StaticLossScale {
  static constexpr bool scaled = true;
  static constexpr bool dynamic = false;
  static constexpr double initial_scale = static_cast<double>(1ull << Power);
};

/// Dynamic loss scaling with DeepSpeed's semantics and defaults (its DynamicLossScaler): the
/// scale starts at 2^InitialPower (initial_scale_power = 16). An overflow skips the step; while
/// hysteresis is left (hysteresis = 2, DeepSpeed's delayed_shift) it spends one unit of it, and
/// once only one unit is left it halves the scale, never below `MinScale` (min_loss_scale = 1),
/// and keeps halving at each further overflow: the budget is not restored by a halving.
/// `Window` steps without overflow (loss_scale_window = 1000) double the scale and restore the
/// hysteresis; with `ConsecutiveHysteresis` (consecutive_hysteresis = false) every step without
/// overflow restores it. Sustained overflows from 65536 with hysteresis 2 give 65536, 32768,
/// 16384, 8192, ...
template <int InitialPower = 16, int Window = 1000, int Hysteresis = 2, int MinScale = 1,
          bool ConsecutiveHysteresis = false>
struct DynamicLossScale {
  static_assert(InitialPower >= 0 && InitialPower < 63, "DynamicLossScale: initial_scale_power must lie in [0, 63)");
  static_assert(Window >= 1, "DynamicLossScale: loss_scale_window must be at least 1");
  static_assert(Hysteresis >= 1, "DynamicLossScale: hysteresis must be at least 1");
  static_assert(MinScale >= 1, "DynamicLossScale: min_loss_scale must be at least 1");
  static constexpr bool scaled = true;
  static constexpr bool dynamic = true;
  static constexpr double initial_scale = static_cast<double>(1ull << InitialPower);
  static constexpr int window = Window;
  static constexpr int hysteresis = Hysteresis;
  static constexpr bool consecutive_hysteresis = ConsecutiveHysteresis;
  static constexpr double min_scale = MinScale;
  static constexpr double backoff = 0.5;
  /// Whether hysteresis and min_scale may be set at run time (StrategyConfig).
  static constexpr bool hysteresis_and_floor = true;
};

/// PyTorch's torch.amp.GradScaler, the scaler of FairScale's ShardedGradScaler and of FSDP's
/// fp16 (Lightning's precision=16 with the fsdp and ddp_sharded strategies), with its defaults:
/// the scale starts at 2^InitialPower (init_scale = 65536); every overflow skips the step and
/// multiplies the scale by backoff_factor = 0.5 at once (no hysteresis, no minimum);
/// `GrowthInterval` steps in a row without overflow (growth_interval = 2000) multiply it by
/// growth_factor = 2.
template <int InitialPower = 16, int GrowthInterval = 2000>
struct GradScalerLossScale {
  static_assert(InitialPower >= 0 && InitialPower < 63, "GradScalerLossScale: init_scale's power must lie in [0, 63)");
  static_assert(GrowthInterval >= 1, "GradScalerLossScale: growth_interval must be at least 1");
  static constexpr bool scaled = true;
  static constexpr bool dynamic = true;
  static constexpr double initial_scale = static_cast<double>(1ull << InitialPower);
  static constexpr int window = GrowthInterval;
  static constexpr int hysteresis = 1;
  static constexpr bool consecutive_hysteresis = false;
  static constexpr double min_scale = 0;
  static constexpr double backoff = 0.5;
  static constexpr bool hysteresis_and_floor = false;
};

/// Required members of a PrecisionPolicy:
///   using family = precision_family;
///   using compute_type;  // dtype of gathered parameters, activations and local gradients
///   using reduce_type;   // dtype gradients are reduced in (float: fp32_reduce_scatter)
///   using master_type;   // dtype of the weights the optimizer updates, and of its state
///   using loss_scale;    // NoLossScale, StaticLossScale<p>, DynamicLossScale<...> (DeepSpeed's)
///                        // or GradScalerLossScale<...> (PyTorch's): a type of one's own has
///                        // their members (engine/loss_scaler.hpp reads them)
template <class P>
concept PrecisionPolicy = PolicyOf<P, precision_family> && requires {
  typename P::compute_type;
  typename P::reduce_type;
  typename P::master_type;
  typename P::loss_scale;
};

/// Mixed precision: parameters are gathered and used in `Compute`, gradients reduced in
/// `Reduce`, and the optimizer updates `Master` weights.
template <class Compute, class Reduce = Compute, class Master = float, class LossScale = NoLossScale>
struct MixedPrecision {
  static_assert(FloatElement<Compute> && FloatElement<Reduce> && FloatElement<Master>,
                "MixedPrecision<Compute, Reduce, Master>: each must be float, double, half or bfloat16");
  static_assert(sizeof(Master) >= sizeof(Compute),
                "MixedPrecision: master weights narrower than the compute dtype would lose every update");
  static_assert(!LossScale::scaled || std::is_same_v<Compute, half> || std::is_same_v<Reduce, half>,
                "loss scaling protects fp16 gradients from underflow: use it when gradients are computed or reduced "
                "in half (bf16 and fp32 have fp32's exponent range and need none)");
  using family = precision_family;
  using compute_type = Compute;
  using reduce_type = Reduce;
  using master_type = Master;
  using loss_scale = LossScale;
  static constexpr bool mixed = !std::is_same_v<Compute, Master>;
  static constexpr const char* name = "MixedPrecision";
};

/// Everything in fp32.
struct Fp32 : MixedPrecision<float, float, float> {
  static constexpr const char* name = "Fp32";
};
/// fp16 compute and reduction, fp32 master weights, DeepSpeed's dynamic loss scaling (Lightning's
/// "16-mixed" with the deepspeed strategies).
struct Fp16Mixed : MixedPrecision<half, half, float, DynamicLossScale<>> {
  static constexpr const char* name = "Fp16Mixed";
};
/// fp16 compute and reduction, fp32 master weights, PyTorch's GradScaler (Lightning's "16-mixed"
/// with the fsdp and ddp_sharded strategies: FairScale's ShardedGradScaler).
struct Fp16Amp : MixedPrecision<half, half, float, GradScalerLossScale<>> {
  static constexpr const char* name = "Fp16Amp";
};
/// bf16 compute and reduction, fp32 master weights, no scaling ("bf16-mixed").
struct Bf16Mixed : MixedPrecision<bfloat16, bfloat16, float> {
  static constexpr const char* name = "Bf16Mixed";
};
/// bf16 everywhere, master weights included.
struct PureBf16 : MixedPrecision<bfloat16, bfloat16, bfloat16> {
  static constexpr const char* name = "PureBf16";
};

}  // namespace polyshard
