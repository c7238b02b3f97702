// NoShard (DDP): every rank holds the whole unit; gradients are all-reduced in buckets, each as
// soon as backward has finished it.
#pragma once

#include "polyshard/engine/sharding/behaviour.hpp"

namespace polyshard {

template <>
struct ShardingBehaviour<NoShard> : detail::WholeParameters, detail::WholeGradients {
  /// Parameters, gradients and master weights, all whole. When compute and master dtypes are
  /// both float, the master weights are the parameters themselves.
  template <class U>
  static void allocate(U& u, std::uint64_t seed) {
    using MT = typename decltype(u.master)::value_type;
    detail::allocate_full_params(u, MemoryCategory::Parameters);
    if constexpr (U::master_is_full) u.master = u.full;
    else u.master = detail::buffer<MT, typename U::step_device>(u, u.layout->padded, MemoryCategory::OptimizerState);
    u.initialize(u.master, 0, seed);
    if constexpr (!U::master_is_full) cast_across(u.master, u.full);
    u.refresh_work_from_full();
    allocate_grads(u);
    u.gathered = true;
  }

  /// All-reduces elements [begin, end) of the local gradients (a bucket, or the whole unit),
  /// in place in the reduced buffer.
  template <class U, class Comm>
  static void reduce_bucket(U& u, Comm& comm, std::vector<PendingReduction>& pending, std::int64_t begin,
                            std::int64_t end) {
    auto bucket = u.reduced.flat_view(begin, end - begin);
    if constexpr (!U::reduces_work) cast_into(u.grad_work.flat_view(begin, end - begin), bucket);
    pending.push_back({comm.all_reduce_async(bucket.span(), ReduceOp::Sum), [] {}});
  }

  template <class U>
  static auto optimizer_params(U& u) { return u.master; }
  template <class U>
  static auto optimizer_grads(U& u) { return u.reduced; }

  /// Where the compute-dtype copy of the master weights lives.
  template <class U>
  static auto compute_copy(U& u) { return u.full; }

  /// Copies updated master weights into the compute-dtype parameters (unless the step wrote them).
  template <class U, class Comm>
  static void after_step(U& u, Comm&) {
    if constexpr (!U::master_is_full)
      if (!u.compute_copy_current) cast_across(u.master, u.full);
    u.refresh_work_from_full();
  }
};

}  // namespace polyshard
