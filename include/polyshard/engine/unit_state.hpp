// The buffers of one unit on one rank, and the operations every sharding policy builds from:
// gather, release, cast, and the bookkeeping of local gradients.
#pragma once

#include <optional>
#include <type_traits>
#include <vector>

#include "polyshard/comm/comm_handle.hpp"
#include "polyshard/engine/units.hpp"
#include "polyshard/nn/init.hpp"
#include "polyshard/tensor/ops/cast.hpp"

namespace polyshard {

/// A collective in flight and what to do when it completes (free a buffer, add a result).
struct PendingReduction {
  CommHandle handle;
  std::function<void()> then;
};

/// One unit's state on one rank. Dtypes: CT compute (gathered parameters, local gradients),
/// RT reduce, MT master. The model itself computes in float on the CPU: when CT is a 16-bit
/// type, `work` and `grad_work` are float copies the modules bind to (counted under Other,
/// since a GPU computes on the 16-bit buffers directly); when CT is float they are the
/// compute-dtype buffers themselves.
template <class CT, class RT, class MT>
struct UnitState {
  static constexpr bool float_compute = std::is_same_v<CT, float>;

  const UnitLayout<float>* layout = nullptr;
  int rank = 0, world = 1;
  std::int64_t shard = 0;  // padded / world

  Tensor<CT> full;         // (padded) parameters in compute dtype
  Tensor<float> work;      // (padded) what the modules compute with (== full when CT is float)
  Tensor<CT> param_shard;  // (shard) persistent parameter shard, when parameters are sharded
  Tensor<float> grad_work; // (padded) what backward writes into
  Tensor<RT> reduced;      // (padded or shard) the reduced gradients the optimizer reads
  Tensor<MT> master;       // (padded or shard) the weights the optimizer updates

  bool local_grads = false;    // grad_work holds gradients not yet reduced
  bool reduced_has_grad = false; // `reduced` holds a gradient since the last zero_grad
  bool gathered = false;       // `work` holds the full parameters

  std::int64_t shard_begin() const { return static_cast<std::int64_t>(rank) * shard; }

  /// Points every parameter of the unit at its slice of `work` and `grad_work`.
  void bind() {
    for (const auto& e : layout->entries)
      e.parameter->bind(e.name, work.flat_view(e.offset, e.numel()).reshape(e.shape),
                        grad_work.flat_view(e.offset, e.numel()).reshape(e.shape));
  }

  /// Elements [begin, begin + out.size()) of the unit, initialised as the parameters' inits say
  /// (padding is zero). A pure function of (seed, names, indices): any rank can build any range.
  template <class X>
  void initialize_range(std::span<X> out, std::int64_t begin, std::uint64_t seed) const {
    std::fill(out.begin(), out.end(), X(0));
    const std::int64_t end = begin + static_cast<std::int64_t>(out.size());
    std::vector<float> tmp;
    for (const auto& e : layout->entries) {
      const std::int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel());
      if (lo >= hi) continue;
      tmp.resize(static_cast<std::size_t>(hi - lo));
      initialize_slice(std::span<float>(tmp), lo - e.offset, e.init, e.name, seed);
      for (std::int64_t i = lo; i < hi; ++i)
        out[static_cast<std::size_t>(i - begin)] = element_cast<X>(tmp[static_cast<std::size_t>(i - lo)]);
    }
  }

  /// Makes `work` hold the full parameters after `full` was filled (casting when CT is 16-bit).
  void refresh_work_from_full() {
    if constexpr (!float_compute) {
      work.storage()->materialize();
      cast_into(full, work);
    }
  }

  /// Zeroes the gradient of every parameter that received none since its last reset, and the
  /// padding, so the whole buffer can be reduced as one.
  void settle_grads() {
    for (const auto& e : layout->entries)
      if (!e.parameter->leaf().node()->has_grad) grad_work.flat_view(e.offset, e.numel()).fill(0.0f);
    const std::int64_t tail = layout->padded - layout->numel;
    if (tail > 0) grad_work.flat_view(layout->numel, tail).fill(0.0f);
  }

  /// Forgets the parameters' gradients: the next backward overwrites instead of adding.
  void reset_grad_flags() {
    for (const auto& e : layout->entries) e.parameter->leaf().zero_grad();
  }
};

}  // namespace polyshard
