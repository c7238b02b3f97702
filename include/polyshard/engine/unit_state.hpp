// The buffers of one unit on one rank, and the operations every sharding policy builds from:
// gather, release, cast, and the bookkeeping of local gradients.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <type_traits>
#include <vector>

#include "polyshard/comm/comm_handle.hpp"
#include "polyshard/engine/gradient_ops.hpp"
#include "polyshard/engine/units.hpp"
#include "polyshard/nn/init.hpp"
#include "polyshard/policy/offload.hpp"
#include "polyshard/tensor/ops/cast.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// A collective in flight and what to do when it completes (free a buffer, add a result).
struct PendingReduction {
  CommHandle handle;
  std::function<void()> then;
  /// The unit whose gradients it reduces (the engine sets it).
  std::size_t unit = static_cast<std::size_t>(-1);
};

/// One unit's state on one rank, its buffers in the memory of device D, but for what the
/// offload policy moves to the host (master weights and optimizer state; parameter shards).
/// Dtypes: CT compute (gathered parameters, local gradients), RT reduce, MT master. A host
/// model computes in float: when CT is a 16-bit type, `work` and `grad_work` are float copies
/// the modules bind to (counted under WorkingCopies); a device model computes in CT on the
/// compute-dtype buffers themselves.
template <class CT, class RT, class MT, Device D = Cpu, class Offload = NoOffload>
struct UnitState {
  using device = D;
  /// Where the optimizer steps the master weights: the host when optimizer state is offloaded.
  using step_device = std::conditional_t<Offload::offloads_optimizer, Cpu, D>;
  /// Where parameter shards live between gathers: the host when parameters are offloaded.
  using shard_device = std::conditional_t<Offload::offloads_parameters, Cpu, D>;
  /// The master weights are the parameters themselves (same type, same memory).
  static constexpr bool master_is_full = std::is_same_v<MT, CT> && std::same_as<step_device, D>;
  static constexpr bool master_is_shard = std::is_same_v<MT, CT> && std::same_as<step_device, shard_device>;
  /// The element type the modules compute in.
  using work_type = std::conditional_t<std::same_as<D, Cpu>, float, CT>;
  /// `work` is `full` itself (no copy to cast into).
  static constexpr bool work_is_full = std::is_same_v<CT, work_type>;
  /// Backward writes straight into the buffer that is reduced (no cast in between).
  static constexpr bool reduces_work = work_is_full && std::is_same_v<RT, work_type>;
  /// What `grad_work` is counted as: the local gradients in compute dtype, or the host's float
  /// working copy of them when the compute dtype is 16-bit.
  static constexpr MemoryCategory grad_work_category =
      work_is_full ? MemoryCategory::Gradients : MemoryCategory::WorkingCopies;
  template <class X>
  using tensor = Tensor<X, D>;

  const UnitLayout<work_type, D>* layout = nullptr;
  int rank = 0, world = 1;
  /// The unit's host buffers of a device model (offloaded state) are page-locked
  /// (StrategyConfig::pin_memory); else pageable, and their transfers are staged.
  bool pin_host = false;
  std::int64_t shard = 0;  // this rank's shard: padded / world, or its own size (uneven shards)
  /// Elements of each shard all-gathered at once after the step where the parameters are
  /// whole and the optimizer sharded (allgather_piece_elements); 0: the whole shard.
  std::int64_t gather_piece = 0;

  tensor<CT> full;              // (padded) parameters in compute dtype
  tensor<work_type> work;       // (padded) what the modules compute with (== full when work_is_full)
  Tensor<CT, shard_device> param_shard;  // (shard) persistent parameter shard, when parameters are sharded
  tensor<work_type> grad_work;  // (padded) what backward writes into
  tensor<RT> reduced;           // (padded or shard) the reduced gradients
  Tensor<MT, step_device> master;      // (padded or shard) the weights the optimizer updates
  Tensor<RT, step_device> step_grads;  // the optimizer's reduced gradients, copied to where it steps
                                       // (undefined when that is where they were reduced)
  tensor<CT> gather_source;     // a parameter shard copied from the host for a gather in flight

  tensor<RT> carried;      // reduced gradients of an earlier backward of this step, added back
                           // once this backward's reduction completes (whole-gradient policies)
  bool local_grads = false;    // grad_work holds gradients not yet reduced
  bool reduced_has_grad = false; // `reduced` holds a gradient since the last zero_grad
  bool gathered = false;       // `work` holds the full parameters
  bool compute_copy_current = false;  // the optimizer step wrote the compute-dtype copy itself

  /// Ranges [first, second) of the unit's elements whose parameters are frozen
  /// (requires_grad false when last read): never reduced (their gradient is zero) nor updated.
  std::vector<std::pair<std::int64_t, std::int64_t>> frozen;

  std::int64_t shard_begin() const { return layout->shard_begin(rank, world); }
  /// Whether every rank's shard is padded / world elements; else each rank's is its own
  /// (ShardPartition::whole_parameters), which a reduce-scatter or an all-gather cannot serve.
  bool even_shards() const { return layout->bounds.empty(); }
  /// Where rank r's shard starts, and its elements.
  std::int64_t owner_begin(int r) const { return layout->shard_begin(r, world); }
  std::int64_t owner_size(int r) const { return layout->shard_size(r, world); }

  /// Points every parameter of the unit at its slice of `work` and `grad_work`, and reads which
  /// are frozen.
  void bind() {
    for (const auto& e : layout->entries)
      e.parameter->bind(e.name, work.flat_view(e.offset, e.numel()).reshape(e.shape),
                        grad_work.flat_view(e.offset, e.numel()).reshape(e.shape));
    // A view of these buffers read while the unit is released names the parameter it was (from
    // a copy of the names: the view may outlive the engine).
    auto names = std::make_shared<std::vector<std::pair<std::int64_t, std::string>>>();
    for (const auto& e : layout->entries) names->emplace_back(e.offset + e.numel(), e.name);
    const std::string unit = layout->display_name();
    work.storage()->describe_views([names, unit](std::int64_t offset) { return describe(*names, unit, offset, ""); });
    if (grad_work.storage() != work.storage())
      grad_work.storage()->describe_views(
          [names, unit](std::int64_t offset) { return describe(*names, unit, offset, "the gradient of "); });
    read_trainable();
  }

  /// "parameter 'NAME' of unit 'UNIT', which is not gathered now": what element `offset` of a
  /// unit's buffers is, given each parameter's end offset and name in order.
  static std::string describe(const std::vector<std::pair<std::int64_t, std::string>>& names, const std::string& unit,
                              std::int64_t offset, const char* prefix) {
    const auto past = std::find_if(names.begin(), names.end(), [&](const auto& n) { return offset < n.first; });
    const std::string what = past == names.end() ? "the padding" : "parameter '" + past->second + "'";
    return prefix + what + " of " + unit + ", which is not gathered now";
  }

  /// The frozen ranges as the parameters' requires_grad flags say now (adjacent ones merged).
  std::vector<std::pair<std::int64_t, std::int64_t>> frozen_ranges_now() const {
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    for (const auto& e : layout->entries) {
      if (e.parameter->requires_grad() || e.numel() == 0) continue;
      if (!out.empty() && out.back().second == e.offset) out.back().second += e.numel();
      else out.emplace_back(e.offset, e.offset + e.numel());
    }
    return out;
  }
  /// Re-reads which parameters are frozen (FairScale's refresh_trainable).
  void read_trainable() { frozen = frozen_ranges_now(); }
  /// Whether entry `e` was frozen when the flags were last read.
  bool is_frozen(const UnitEntry<work_type, D>& e) const {
    return std::any_of(frozen.begin(), frozen.end(), [&](const auto& r) { return r.first <= e.offset && e.offset < r.second; });
  }
  /// The first parameter whose requires_grad differs from what was last read, or null.
  const UnitEntry<work_type, D>* trainable_changed() const {
    for (const auto& e : layout->entries)
      if (e.numel() > 0 && is_frozen(e) == e.parameter->requires_grad()) return &e;
    return nullptr;
  }

  /// step_trainable over each sub-group of `groups` (engine/optimizer_groups.hpp): what the
  /// group steps (its slice of the rank's optimizer span `params`, the whole unit or its shard
  /// when the span is shorter, or its own masters), and its slices of the gradients and of the
  /// compute copy. `around(k, step)` calls step() for group k, with what the group needs brought
  /// in around it (its state, from NVMe), and returns whether the compute copy's slice is
  /// current: step()'s result, true when the optimizer wrote it. True when every group's is.
  template <class Groups, class P, class G, Device E, class Around, class Compute = std::nullptr_t>
  bool step_groups(Groups& groups, const Tensor<P, E>& params, const Tensor<G, E>& grads, double grad_scale,
                   Around&& around, const Compute& compute = nullptr) const {
    const std::int64_t begin = params.numel() == layout->padded ? 0 : shard_begin();
    bool current = true;
    for (std::size_t k = 0; k < groups.size(); ++k) {
      const std::int64_t at = groups.offset(k), n = groups.numel(k);
      current = around(k, [&] {
        const Tensor<P, E> mine = groups.params(k, params);
        if constexpr (std::is_same_v<Compute, std::nullptr_t>)
          return step_trainable(groups[k], mine, grads.flat_view(at, n), grad_scale, begin + at);
        else
          return step_trainable(groups[k], mine, grads.flat_view(at, n), grad_scale, begin + at,
                                compute.flat_view(at, n));
      }) && current;
    }
    return current;
  }

  /// optimizer.step(params, grads) over `params`, elements [begin, begin + params.numel()) of
  /// the unit, leaving the frozen elements as they were: their values bit for bit, and their
  /// optimizer state (zero while they were never trained). The optimizers are elementwise, so
  /// the trainable elements get the bits of a step without frozen neighbours. The frozen part
  /// of the span is copied aside and put back: the Optimizer concept updates its whole span in
  /// one call.
  ///
  /// Every gradient counts times `grad_scale` (the loss scale undone, the clipping): the
  /// library's optimizers multiply as they read; an optimizer of the Optimizer concept's
  /// two-argument step alone gets the gradients scaled in place first.
  ///
  /// `compute`, when given, is where the compute-dtype copy of the updated weights goes: an
  /// optimizer that writes it in the same pass (the fused kernels) does so when no element of
  /// the span is frozen, and the function returns true; otherwise the caller casts it.
  template <class Opt, class P, class G, Device E, class Compute = std::nullptr_t>
  bool step_trainable(Opt& optimizer, const Tensor<P, E>& params, const Tensor<G, E>& grads, double grad_scale,
                      std::int64_t begin, const Compute& compute = nullptr) const {
    constexpr bool scales_grads = requires { optimizer.step(params.span(), std::span<const G>(grads.span()), 1.0); };
    const std::int64_t n = params.numel();
    std::vector<std::pair<std::int64_t, std::int64_t>> mine;  // frozen ranges within the span, from its start
    std::int64_t count = 0;
    for (const auto& [lo, hi] : frozen) {
      const std::int64_t a = std::max(lo, begin) - begin, b = std::min(hi, begin + n) - begin;
      if (a < b) {
        mine.emplace_back(a, b);
        count += b - a;
      }
    }
    if constexpr (!scales_grads) {
      if (grad_scale != 1.0) scale_gradients(grads, grad_scale);
      grad_scale = 1.0;
    }
    const auto step = [&] {
      if constexpr (scales_grads) optimizer.step(params.span(), std::span<const G>(grads.span()), grad_scale);
      else optimizer.step(params.span(), std::span<const G>(grads.span()));
    };
    if (mine.empty()) {
      if constexpr (!std::is_same_v<Compute, std::nullptr_t>) {
        optimizer.step(params.span(), std::span<const G>(grads.span()), compute.span(), grad_scale);
        return true;
      }
      step();
      return false;
    }
    // The state tensors as long as the span (optimizers keep one value per element each).
    std::vector<Tensor<P, E>> state;
    for (auto& [name, t] : optimizer.state())
      if (t.numel() == n) state.push_back(t);
    auto saved = Tensor<P, E>::empty({count * static_cast<std::int64_t>(1 + state.size())}, MemoryCategory::Other);
    const auto copy = [&](bool out) {
      std::int64_t at = 0;
      for (const auto& [a, b] : mine) {
        for (std::size_t s = 0; s <= state.size(); ++s) {
          const Tensor<P, E> where = (s == 0 ? params : state[s - 1]).flat_view(a, b - a);
          const Tensor<P, E> aside = saved.flat_view(at, b - a);
          if (out) aside.copy_from(where);
          else where.copy_from(aside);
          at += b - a;
        }
      }
    };
    copy(true);
    step();
    copy(false);
    return false;
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

  /// `out` := elements [begin, begin + out.numel()) of the unit as initialize_range builds them
  /// (on the host, then copied to the device).
  template <class X, Device E>
  void initialize(const Tensor<X, E>& out, std::int64_t begin, std::uint64_t seed) const {
    if constexpr (std::same_as<E, Cpu>) {
      initialize_range(out.span(), begin, seed);
    } else {
      Tensor<X> host = Tensor<X>::empty(out.shape(), MemoryCategory::Other);
      initialize_range(host.span(), begin, seed);
      copy_across(host, out);
    }
  }

  /// The parameter shard in the memory of D, for a collective there: itself, or a copy of the
  /// host's (counted under Communication).
  tensor<CT> param_shard_on_device() const {
    if constexpr (std::same_as<shard_device, D>) {
      return param_shard;
    } else {
      auto copy = tensor<CT>::empty(param_shard.shape(), MemoryCategory::Communication);
      copy_across(param_shard, copy);
      return copy;
    }
  }

  /// Makes `work` hold the full parameters after `full` was filled (casting when CT is 16-bit
  /// on the host).
  void refresh_work_from_full() {
    if constexpr (!work_is_full) {
      work.storage()->materialize();
      cast_into(full, work);
    }
  }

  /// Zeroes, within elements [begin, end), the gradient of every parameter that received none
  /// since its last reset, of the frozen ones, and the padding, so that the range (a bucket)
  /// can be reduced as one.
  void settle_grads(std::int64_t begin, std::int64_t end) {
    const auto zero = [&](std::int64_t lo, std::int64_t hi) {
      lo = std::max(lo, begin);
      hi = std::min(hi, end);
      if (lo < hi) grad_work.flat_view(lo, hi - lo).fill(work_type(0));
    };
    for (const auto& e : layout->entries)
      if (!e.parameter->leaf().node()->has_grad) zero(e.offset, e.offset + e.numel());
    for (const auto& [lo, hi] : frozen) zero(lo, hi);
    zero(layout->numel, layout->padded);  // the padding, after the last parameter (none in uneven shards)
  }

  /// Forgets the parameters' gradients: the next backward overwrites instead of adding.
  void reset_grad_flags() {
    for (const auto& e : layout->entries) e.parameter->leaf().zero_grad();
  }
};

}  // namespace polyshard
