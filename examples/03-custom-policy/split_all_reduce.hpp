// A sharding policy of one's own and its engine behaviour, in a header of its own:
// SplitAllReduce is DDP whose gradient all-reduce is issued as its two ring halves, a
// reduce-scatter into the rank's shard followed by an all-gather of the shards.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <polyshard/engine/engine.hpp>

namespace polyshard {

// [policy]
/// Holds what NoShard holds: every flag (whole parameters, gradients and optimizer state on
/// every rank) is inherited, so Strategy's checks and the compile-time accounting treat it as
/// DDP. Only its name, and so its ShardingBehaviour, is its own.
struct SplitAllReduce : NoShard {
  static constexpr const char* name = "SplitAllReduce";
};
static_assert(ShardingPolicy<SplitAllReduce>);
// [policy]

// [behaviour]
/// Everything but the gradient reduction is NoShard's: allocate (whole buffers), gather and
/// release (nothing to do), begin_backward, optimizer_params and optimizer_grads (the whole
/// unit), after_step (cast the master weights into the compute dtype).
template <>
struct ShardingBehaviour<SplitAllReduce> : ShardingBehaviour<NoShard> {
  /// Called when unit `u`'s local gradients are complete. Issues the reduction without
  /// waiting for it: the engine waits for every entry of `pending` (and runs its `then`)
  /// before the optimizer step. The communicator runs asynchronous calls in issue order, so
  /// the all-gather starts after the reduce-scatter has filled `shard`.
  template <class U, class Comm>
  static void reduce(U& u, Comm& comm, std::vector<PendingReduction>& pending, std::int64_t /*bucket_elements*/) {
    using RT = typename decltype(u.reduced)::value_type;
    // Local gradients in the reduce dtype (when backward computes in it, they already are).
    if constexpr (!U::reduces_work) cast_into(u.grad_work, u.reduced);
    // (padded / N), in the memory of the unit's device
    auto shard = U::template tensor<RT>::empty({u.shard}, MemoryCategory::Communication);
    CommHandle scatter = comm.reduce_scatter_async(std::span<const RT>(u.reduced.span()), shard.span(), ReduceOp::Sum);
    CommHandle gather = comm.all_gather_async(std::span<const RT>(shard.span()), u.reduced.span());
    pending.push_back({std::move(scatter), [] {}});
    pending.push_back({std::move(gather), [shard] {}});  // holds the shard until the gather is done
    u.local_grads = false;       // nothing left to reduce
    u.reduced_has_grad = true;   // `reduced` holds this step's gradient
  }
};
// [behaviour]

}  // namespace polyshard
