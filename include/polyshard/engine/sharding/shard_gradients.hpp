// ShardGradients (ZeRO-2, FairScale OSS + ShardedDataParallel): whole parameters; a unit's
// local gradients exist only during its backward and are reduce-scattered into the shard the
// rank owns, which is all of the gradient it keeps.
#pragma once

#include "polyshard/engine/sharding/behaviour.hpp"
#include "polyshard/engine/sharding/shard_optimizer_state.hpp"

namespace polyshard {

namespace detail {
/// Gradient handling shared by ShardGradients and ShardParameters: transient whole local
/// gradients, a persistent reduced shard.
struct ShardedGradients {
  template <class U>
  static void allocate_grads(U& u) {
    using RT = typename decltype(u.reduced)::value_type;
    u.grad_work = buffer<float>(u.layout->padded, MemoryCategory::Gradients);
    u.grad_work.storage()->release();
    u.reduced = buffer<RT>(u.shard, MemoryCategory::Gradients);
  }

  template <class U>
  static void begin_backward(U& u) {
    if (u.local_grads) return;  // accumulating under no_sync: the local gradients stay
    u.grad_work.storage()->materialize();
    u.reset_grad_flags();
  }

  template <class U, class Comm>
  static void reduce(U& u, Comm& comm, std::vector<PendingReduction>& pending, std::int64_t) {
    auto work = u.grad_work.storage();
    reduce_scatter_grads(u, comm, pending, u.reduced, u.reduced_has_grad, [work] { work->release(); });
    u.local_grads = false;
    u.reduced_has_grad = true;
  }
};
}  // namespace detail

template <>
struct ShardingBehaviour<ShardGradients> : detail::ShardedGradients {
  template <class U>
  static void allocate(U& u, std::uint64_t seed) {
    using CT = typename decltype(u.full)::value_type;
    using MT = typename decltype(u.master)::value_type;
    detail::allocate_full_params(u, MemoryCategory::Parameters);
    u.initialize_range(u.full.span(), 0, seed);
    if constexpr (std::is_same_v<MT, CT>) {
      u.master = u.full.flat_view(u.shard_begin(), u.shard);
    } else {
      u.master = detail::buffer<MT>(u.shard, MemoryCategory::OptimizerState);
      u.initialize_range(u.master.span(), u.shard_begin(), seed);
    }
    u.refresh_work_from_full();
    allocate_grads(u);
    u.gathered = true;
  }

  template <class U, class Comm>
  static void gather(U&, Comm&) {}
  template <class U>
  static void release(U&) {}

  template <class U>
  static auto optimizer_params(U& u) { return u.master.span(); }
  template <class U>
  static auto optimizer_grads(U& u) { return u.reduced.span(); }

  template <class U, class Comm>
  static void after_step(U& u, Comm& comm) {
    ShardingBehaviour<ShardOptimizerState>::after_step(u, comm);
  }
};

}  // namespace polyshard
