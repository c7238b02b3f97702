// ShardParameters (ZeRO-3, FSDP): each rank keeps 1/N of every unit's parameters, gradients
// and optimizer state. A unit's parameters are all-gathered before its forward and again
// before its backward (unless they stayed gathered: reshard_after_forward = false), and freed
// after each; its gradients are reduce-scattered as soon as its backward is done.
#pragma once

#include "polyshard/engine/sharding/behaviour.hpp"

namespace polyshard {

template <bool ReshardAfterForward>
struct ShardingBehaviour<ShardParameters<ReshardAfterForward>> : detail::ShardedGradients {
  /// Builds only the rank's shard: the whole unit never exists on a rank outside a gather.
  template <class U>
  static void allocate(U& u, std::uint64_t seed) {
    using CT = typename decltype(u.full)::value_type;
    using MT = typename decltype(u.master)::value_type;
    detail::allocate_full_params(u, MemoryCategory::Parameters, /*materialized=*/false);
    u.param_shard = detail::buffer<CT, typename U::shard_device>(u, u.shard, MemoryCategory::Parameters);
    if constexpr (U::master_is_shard) {
      u.master = u.param_shard;
      u.initialize(u.master, u.shard_begin(), seed);
    } else {
      u.master = detail::buffer<MT, typename U::step_device>(u, u.shard, MemoryCategory::OptimizerState);
      u.initialize(u.master, u.shard_begin(), seed);
      cast_across(u.master, u.param_shard);
    }
    allocate_grads(u);
    u.gathered = false;
  }

  template <class U, class Comm>
  static void gather(U& u, Comm& comm) {
    if (u.gathered) return;
    start_gather(u, comm).wait();
    finish_gather(u);
  }

  /// The two halves of gather, for prefetching: issue the all-gather into the unit's whole
  /// buffer, and, once it completed, make the modules' view of it current.
  template <class U, class Comm>
  static CommHandle start_gather(U& u, Comm& comm) {
    using CT = typename decltype(u.full)::value_type;
    u.full.storage()->materialize();
    u.gather_source = u.param_shard_on_device();  // kept until the gather completes
    return comm.all_gather_async(std::span<const CT>(u.gather_source.span()), u.full.span());
  }
  template <class U>
  static void finish_gather(U& u) {
    u.gather_source = {};
    if constexpr (!U::work_is_full) {
      u.refresh_work_from_full();
      u.full.storage()->release();  // the float copy is what computes on the host
    }
    u.gathered = true;
  }

  template <class U>
  static void release(U& u) {
    u.work.storage()->release();
    u.full.storage()->release();
    u.gathered = false;
  }

  template <class U>
  static auto optimizer_params(U& u) { return u.master; }

  /// Where the compute-dtype copy of the master shard lives.
  template <class U>
  static auto compute_copy(U& u) { return u.param_shard; }

  /// The updated master shard becomes the parameter shard; the next forward gathers it.
  template <class U, class Comm>
  static void after_step(U& u, Comm&) {
    if constexpr (!U::master_is_shard)
      if (!u.compute_copy_current) cast_across(u.master, u.param_shard);
  }
};

}  // namespace polyshard
