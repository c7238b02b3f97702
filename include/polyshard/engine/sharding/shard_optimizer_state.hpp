// ShardOptimizerState (ZeRO-1, FairScale OSS): whole parameters and gradients on every rank;
// each rank reduces, updates and re-broadcasts (all-gathers) only its shard.
#pragma once

#include "polyshard/engine/sharding/behaviour.hpp"

namespace polyshard {

template <>
struct ShardingBehaviour<ShardOptimizerState> : detail::WholeParameters, detail::WholeGradients {
  template <class U>
  static void allocate(U& u, std::uint64_t seed) {
    allocate_with_master_shard(u, seed);
    allocate_grads(u);
  }

  /// Reduces elements [begin, end) of the local gradients to the ranks owning them; the rank's
  /// reduced shard lands in its slice of the (whole) gradient buffer, which is what the
  /// optimizer reads. The whole unit goes as one reduce-scatter, a bucket as one reduce per
  /// owner, in place in the gradient buffer (other ranks' slices of it are not read).
  template <class U, class Comm>
  static void reduce_bucket(U& u, Comm& comm, std::vector<PendingReduction>& pending, std::int64_t begin,
                            std::int64_t end) {
    if (comm.size() == 1) {  // one rank: its local gradients are the reduced ones
      if constexpr (!U::reduces_work)
        cast_into(u.grad_work.flat_view(begin, end - begin), u.reduced.flat_view(begin, end - begin));
      return;
    }
    if (!detail::whole_unit(u, begin, end)) {
      detail::for_each_owner(u, begin, end, [&](int owner, std::int64_t a, std::int64_t b) {
        auto piece = u.reduced.flat_view(a, b - a);
        if constexpr (!U::reduces_work) cast_into(u.grad_work.flat_view(a, b - a), piece);
        pending.push_back({comm.reduce_async(piece.span(), owner, ReduceOp::Sum), [] {}});
      });
      return;
    }
    auto mine = u.reduced.flat_view(u.shard_begin(), u.shard);
    if constexpr (!U::reduces_work) {
      // gradients_to_reduce casts into a separate buffer, so the output slice aliases nothing.
      detail::reduce_scatter_grads(u, comm, pending, mine, false, [] {});
    } else {
      // Reduce from a copy: the output slice lies inside the buffer being reduced.
      using RT = typename decltype(u.reduced)::value_type;
      auto src = u.grad_work.clone(MemoryCategory::Communication);
      auto out = detail::buffer<RT>(u, u.shard, MemoryCategory::Communication);
      CommHandle h = comm.reduce_scatter_async(std::span<const RT>(src.span()), out.span(), ReduceOp::Sum);
      pending.push_back({std::move(h), [src, out, mine] { mine.copy_from(out); }});
    }
  }

  template <class U>
  static auto optimizer_params(U& u) { return u.master; }
  template <class U>
  static auto optimizer_grads(U& u) { return u.reduced.flat_view(u.shard_begin(), u.shard); }

  template <class U, class Comm>
  static void after_step(U& u, Comm& comm) { write_back_and_gather(u, comm); }
};

}  // namespace polyshard
