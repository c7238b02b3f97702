// What a sharding policy does at each point of a step, as one specialization per policy:
// allocate (state at start-up), gather (before a unit's forward and backward), release (after
// them), begin_backward, reduce_bucket (as soon as backward has finished a bucket of a unit's
// gradients) and end_reduction (after the unit's last bucket), optimizer spans, after_step.
#pragma once

#include <vector>

#include "polyshard/comm/communicator.hpp"
#include "polyshard/engine/unit_state.hpp"
#include "polyshard/tensor/ops/elementwise.hpp"
#include "polyshard/policy/sharding.hpp"

namespace polyshard {

template <class Sharding>
struct ShardingBehaviour {
  static_assert(sizeof(Sharding) == 0,
                "no engine behaviour for this sharding policy: specialize ShardingBehaviour<P> in a header of "
                "its own (see engine/sharding/*.hpp)");
};

namespace detail {
/// A tensor of `n` elements in the memory of device Where (by default unit state U's device),
/// counted under `category`. A host buffer of a device unit (offloaded state, whose every step
/// moves to or from the device) comes from the device's staging allocator (page-locked for
/// CUDA) when the unit pins its host memory (StrategyConfig::pin_memory); else it is pageable
/// and the device stages its transfers through page-locked chunks of its own.
template <class X, class Where = void, class U>
auto buffer(const U& u, std::int64_t n, MemoryCategory category) {
  using D = typename U::device;
  using E = std::conditional_t<std::is_void_v<Where>, D, Where>;
  if constexpr (std::same_as<E, Cpu> && !std::same_as<D, Cpu>) {
    if (u.pin_host) return host_staging_tensor<X, D>({n}, category);
  }
  return Tensor<X, E>::empty({n}, category);
}

/// The compute-dtype parameters and the view the modules bind to (a float copy on the host
/// when CT is 16-bit); with `materialized` false they get memory only when a gather
/// materializes them.
template <class U>
void allocate_full_params(U& u, MemoryCategory category, bool materialized = true) {
  using CT = typename decltype(u.full)::value_type;
  using W = typename U::work_type;
  const std::int64_t n = u.layout->padded;
  u.full = materialized ? buffer<CT>(u, n, category) : U::template tensor<CT>::unmaterialized({n}, category);
  if constexpr (U::work_is_full) u.work = u.full;
  else
    u.work = materialized ? buffer<W>(u, n, MemoryCategory::WorkingCopies)
                          : U::template tensor<W>::unmaterialized({n}, MemoryCategory::WorkingCopies);
}

/// The local gradients of a unit as the reduce dtype: grad_work itself when that is the reduce
/// dtype already, a cast copy (counted under Communication) otherwise.
template <class U>
auto gradients_to_reduce(U& u) {
  using RT = typename decltype(u.reduced)::value_type;
  if constexpr (std::is_same_v<RT, typename U::work_type>) {
    return u.grad_work;
  } else {
    auto tmp = buffer<RT>(u, u.layout->padded, MemoryCategory::Communication);
    cast_into(u.grad_work, tmp);
    return tmp;
  }
}

/// Reduce-scatters the unit's local gradients into `out` (shard elements), adding to what is
/// there when `accumulate`. `done` runs once the collective completed.
template <class U, class Comm, class Out>
void reduce_scatter_grads(U& u, Comm& comm, std::vector<PendingReduction>& pending, const Out& out, bool accumulate,
                          std::function<void()> done) {
  using RT = typename decltype(u.reduced)::value_type;
  auto src = gradients_to_reduce(u);
  if (!accumulate) {
    CommHandle h = comm.reduce_scatter_async(std::span<const RT>(src.span()), out.span(), ReduceOp::Sum);
    pending.push_back({std::move(h), [src, done = std::move(done)] { done(); }});
  } else {
    auto tmp = buffer<RT>(u, out.numel(), MemoryCategory::Communication);
    CommHandle h = comm.reduce_scatter_async(std::span<const RT>(src.span()), tmp.span(), ReduceOp::Sum);
    pending.push_back({std::move(h), [src, tmp, out, done = std::move(done)] {
                         add_into(out, tmp, out);  // out += tmp, in float for the 16-bit types
                         done();
                       }});
  }
}

/// Calls f(owner, begin, end) for each rank whose shard of the unit meets elements
/// [begin, end), with the part that falls in it: the pieces a bucket is reduced to their
/// owners in.
template <class U, class F>
void for_each_owner(const U& u, std::int64_t begin, std::int64_t end, F&& f) {
  for (int r = 0; r < u.world; ++r) {
    const std::int64_t lo = std::max(begin, u.owner_begin(r)), hi = std::min(end, u.owner_begin(r) + u.owner_size(r));
    if (lo < hi) f(r, lo, hi);
  }
}

/// Whether elements [begin, end) are the whole unit cut into equal shards: reduced then as one
/// reduce-scatter.
template <class U>
bool whole_unit(const U& u, std::int64_t begin, std::int64_t end) {
  return begin == 0 && end == u.layout->padded && u.even_shards();
}

/// Parameters that stay whole on every rank (NoShard, ShardOptimizerState, ShardGradients):
/// nothing to gather or free around a unit.
struct WholeParameters {
  template <class U, class Comm>
  static void gather(U&, Comm&) {}
  template <class U>
  static void release(U&) {}

  /// Whole parameters built from the deterministic init on every rank (no broadcast needed),
  /// and master weights for the rank's shard only: with all-float dtypes, the master shard is
  /// the rank's slice of the parameters themselves.
  template <class U>
  static void allocate_with_master_shard(U& u, std::uint64_t seed) {
    using MT = typename decltype(u.master)::value_type;
    allocate_full_params(u, MemoryCategory::Parameters);
    u.initialize(u.full, 0, seed);
    if constexpr (U::master_is_full) {
      u.master = u.full.flat_view(u.shard_begin(), u.shard);
    } else {
      u.master = buffer<MT, typename U::step_device>(u, u.shard, MemoryCategory::OptimizerState);
      u.initialize(u.master, u.shard_begin(), seed);
    }
    u.refresh_work_from_full();
    u.gathered = true;
  }

  /// Where the compute-dtype copy of the rank's master shard lives: its slice of the parameters.
  template <class U>
  static auto compute_copy(U& u) { return u.full.flat_view(u.shard_begin(), u.shard); }

  /// Writes the updated master shard into the parameters (unless the step wrote it) and
  /// all-gathers every rank's shard: at once, or in pieces of u.gather_piece elements of each
  /// shard (StrategyConfig::allgather_bucket_size, as DeepSpeed's stages 1 and 2 cut theirs).
  template <class U, class Comm>
  static void write_back_and_gather(U& u, Comm& comm) {
    using CT = typename decltype(u.full)::value_type;
    if constexpr (!U::master_is_full)
      if (!u.compute_copy_current) cast_across(u.master, compute_copy(u));
    if (comm.size() == 1) {  // the one shard is the whole unit: nothing to gather
      u.refresh_work_from_full();
      return;
    }
    if (!u.even_shards()) {
      // Shards of their own sizes (whole parameters): each from its owner, as OSS broadcasts them.
      for (int r = 0; r < u.world; ++r)
        if (u.owner_size(r) > 0) comm.broadcast(u.full.flat_view(u.owner_begin(r), u.owner_size(r)).span(), r);
    } else if (u.gather_piece <= 0 || u.gather_piece >= u.shard) {
      // The input is copied out first: a collective's input must not alias its output.
      auto mine = u.full.flat_view(u.shard_begin(), u.shard).clone(MemoryCategory::Communication);
      comm.all_gather(std::span<const CT>(mine.span()), u.full.span());
    } else {
      // Piece k of every shard lands in one buffer, rank after rank, then where each shard is:
      // an all-gather writes each rank's input contiguously, and the pieces of a unit are not.
      // The two buffers are the first piece's size, reused by the others.
      const std::int64_t ranks = comm.size();
      auto mine = decltype(u.full)::empty({u.gather_piece}, MemoryCategory::Communication);
      auto all = decltype(u.full)::empty({ranks * u.gather_piece}, MemoryCategory::Communication);
      for (std::int64_t at = 0; at < u.shard; at += u.gather_piece) {
        const std::int64_t n = std::min(u.gather_piece, u.shard - at);
        const auto in = mine.flat_view(0, n), out = all.flat_view(0, ranks * n);
        in.copy_from(u.full.flat_view(u.shard_begin() + at, n));
        comm.all_gather(std::span<const CT>(in.span()), out.span());
        for (std::int64_t r = 0; r < ranks; ++r)
          if (r != u.rank) u.full.flat_view(r * u.shard + at, n).copy_from(out.flat_view(r * n, n));
      }
    }
    u.refresh_work_from_full();
  }
};

/// Whole local gradients kept between backward and step (NoShard, ShardOptimizerState): with
/// all-float dtypes backward writes straight into the buffer that is reduced.
struct WholeGradients {
  template <class U>
  static void allocate_grads(U& u) {
    using W = typename U::work_type;
    const std::int64_t n = u.layout->padded;
    if constexpr (U::reduces_work) {
      u.grad_work = buffer<W>(u, n, MemoryCategory::Gradients);
      u.reduced = u.grad_work;
    } else {
      using RT = typename decltype(u.reduced)::value_type;
      u.grad_work = buffer<W>(u, n, U::grad_work_category);
      u.reduced = buffer<RT>(u, n, MemoryCategory::Gradients);
    }
  }

  /// A backward after an earlier synchronised one of the same step: the reduced gradients in
  /// the buffer backward is about to overwrite are carried aside and added back by
  /// add_carried once the new gradients are reduced (reducing them again would count them N times).
  template <class U>
  static void begin_backward(U& u) {
    if (u.local_grads) return;  // accumulating under no_sync: the local gradients stay
    if (u.reduced_has_grad) u.carried = u.reduced.clone(MemoryCategory::Gradients);
    u.reset_grad_flags();
  }

  /// After the unit's last bucket: the carried gradients are added back to the reduced ones
  /// once every reduction issued before completes (at once when the unit issued none), and the
  /// local gradients count as reduced.
  template <class U>
  static void end_reduction(U& u, std::vector<PendingReduction>& pending, bool issued) {
    if (u.carried.defined()) {
      auto carried = u.carried, reduced = u.reduced;
      u.carried = {};
      if (!issued) add_into(reduced, carried, reduced);
      else pending.push_back({CommHandle{}, [carried, reduced] { add_into(reduced, carried, reduced); }});
    }
    u.local_grads = false;
    u.reduced_has_grad = true;
  }
};

/// Gradients of a unit that exist whole only during its backward and are reduce-scattered into
/// the shard the rank owns (ShardGradients, ShardParameters).
struct ShardedGradients {
  template <class U>
  static void allocate_grads(U& u) {
    using RT = typename decltype(u.reduced)::value_type;
    u.grad_work = U::template tensor<typename U::work_type>::unmaterialized({u.layout->padded}, U::grad_work_category);
    u.reduced = buffer<RT>(u, u.shard, MemoryCategory::Gradients);
  }

  template <class U>
  static void begin_backward(U& u) {
    if (u.local_grads) return;  // accumulating under no_sync: the local gradients stay
    u.grad_work.storage()->materialize();
    u.reset_grad_flags();
  }

  /// Reduces elements [begin, end) of the local gradients into the shard of the rank owning
  /// each: the whole unit as one reduce-scatter; a bucket as one reduce per owner, the owner
  /// writing (or adding, when `reduced` holds a gradient already) its piece into its shard.
  template <class U, class Comm>
  static void reduce_bucket(U& u, Comm& comm, std::vector<PendingReduction>& pending, std::int64_t begin,
                            std::int64_t end) {
    using RT = typename decltype(u.reduced)::value_type;
    if (whole_unit(u, begin, end)) {
      reduce_scatter_grads(u, comm, pending, u.reduced, u.reduced_has_grad, [] {});
      return;
    }
    const bool accumulate = u.reduced_has_grad;
    for_each_owner(u, begin, end, [&](int owner, std::int64_t a, std::int64_t b) {
      // The piece in the reduce dtype, reduced in place (the local gradients are not read again).
      typename U::template tensor<RT> piece;
      if constexpr (std::is_same_v<RT, typename U::work_type>) {
        piece = u.grad_work.flat_view(a, b - a);
      } else {
        piece = buffer<RT>(u, b - a, MemoryCategory::Communication);
        cast_into(u.grad_work.flat_view(a, b - a), piece);
      }
      CommHandle h = comm.reduce_async(piece.span(), owner, ReduceOp::Sum);
      if (owner != u.rank) {
        pending.push_back({std::move(h), [piece] {}});
        return;
      }
      auto out = u.reduced.flat_view(a - u.shard_begin(), b - a);
      pending.push_back({std::move(h), [piece, out, accumulate] {
                           if (accumulate) add_into(out, piece, out);
                           else out.copy_from(piece);
                         }});
    });
  }

  /// After the unit's last bucket: its whole local gradients are freed once every reduction
  /// issued before completes.
  template <class U>
  static void end_reduction(U& u, std::vector<PendingReduction>& pending, bool) {
    auto work = u.grad_work.storage();
    pending.push_back({CommHandle{}, [work] { work->release(); }});
    u.local_grads = false;
    u.reduced_has_grad = true;
  }

  template <class U>
  static auto optimizer_grads(U& u) { return u.reduced; }
};
}  // namespace detail

}  // namespace polyshard
