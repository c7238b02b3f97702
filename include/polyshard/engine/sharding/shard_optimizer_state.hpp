// ShardOptimizerState (ZeRO-1, FairScale OSS): whole parameters and gradients on every rank;
// each rank reduces, updates and re-broadcasts (all-gathers) only its shard.
#pragma once

#include "polyshard/engine/sharding/behaviour.hpp"

namespace polyshard {

template <>
struct ShardingBehaviour<ShardOptimizerState> {
  /// Master weights and optimizer state for the rank's shard only; with all-float dtypes the
  /// master shard is the rank's slice of the parameters.
  template <class U>
  static void allocate(U& u, std::uint64_t seed) {
    using CT = typename decltype(u.full)::value_type;
    using RT = typename decltype(u.reduced)::value_type;
    using MT = typename decltype(u.master)::value_type;
    const std::int64_t n = u.layout->padded;
    detail::allocate_full_params(u, MemoryCategory::Parameters);
    // Every rank builds the whole parameters from the deterministic init: no broadcast needed.
    u.initialize_range(u.full.span(), 0, seed);
    if constexpr (std::is_same_v<MT, CT>) {
      u.master = u.full.flat_view(u.shard_begin(), u.shard);
    } else {
      u.master = detail::buffer<MT>(u.shard, MemoryCategory::OptimizerState);
      u.initialize_range(u.master.span(), u.shard_begin(), seed);
    }
    u.refresh_work_from_full();
    if constexpr (U::float_compute && std::is_same_v<RT, float>) {
      u.grad_work = detail::buffer<float>(n, MemoryCategory::Gradients);
      u.reduced = u.grad_work;
    } else {
      u.grad_work = detail::buffer<float>(n, MemoryCategory::Other);
      u.reduced = detail::buffer<RT>(n, MemoryCategory::Gradients);
    }
    u.gathered = true;
  }

  template <class U, class Comm>
  static void gather(U&, Comm&) {}
  template <class U>
  static void release(U&) {}
  template <class U>
  static void begin_backward(U& u) {
    if (!u.local_grads) u.reset_grad_flags();
  }

  /// Reduce-scatters the whole local gradients; the rank's reduced shard lands in its slice of
  /// the (whole) gradient buffer, which is what the optimizer reads.
  template <class U, class Comm>
  static void reduce(U& u, Comm& comm, std::vector<PendingReduction>& pending, std::int64_t) {
    using RT = typename decltype(u.reduced)::value_type;
    Tensor<RT> mine = u.reduced.flat_view(u.shard_begin(), u.shard);
    if constexpr (!(U::float_compute && std::is_same_v<RT, float>)) {
      // Reduce from a copy: the output slice lies inside the buffer being reduced.
      detail::reduce_scatter_grads(u, comm, pending, mine, false, [] {});
    } else {
      Tensor<RT> src = u.grad_work.clone(MemoryCategory::Communication);
      Tensor<RT> out = detail::buffer<RT>(u.shard, MemoryCategory::Communication);
      CommHandle h = comm.reduce_scatter_async(std::span<const RT>(src.span()), out.span(), ReduceOp::Sum);
      pending.push_back({std::move(h), [src, out, mine] { mine.copy_from(out); }});
    }
    u.local_grads = false;
    u.reduced_has_grad = true;
  }

  template <class U>
  static auto optimizer_params(U& u) { return u.master.span(); }
  template <class U>
  static auto optimizer_grads(U& u) { return u.reduced.flat_view(u.shard_begin(), u.shard).span(); }

  /// Writes the updated shard into the parameters and all-gathers every rank's shard.
  template <class U, class Comm>
  static void after_step(U& u, Comm& comm) {
    using CT = typename decltype(u.full)::value_type;
    using MT = typename decltype(u.master)::value_type;
    if constexpr (!std::is_same_v<MT, CT>) cast_into(u.master, u.full.flat_view(u.shard_begin(), u.shard));
    detail::all_gather_updated_shard(u, comm);
  }
};

}  // namespace polyshard
