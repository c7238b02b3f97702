// What a sharding policy does at each point of a step, as one specialization per policy:
// allocate (state at start-up), gather (before a unit's forward and backward), release (after
// them), begin_backward, reduce (after a unit's backward), optimizer spans, after_step.
#pragma once

#include <vector>

#include "polyshard/comm/communicator.hpp"
#include "polyshard/engine/unit_state.hpp"
#include "polyshard/policy/sharding.hpp"

namespace polyshard {

template <class Sharding>
struct ShardingBehaviour {
  static_assert(sizeof(Sharding) == 0,
                "no engine behaviour for this sharding policy: specialize ShardingBehaviour<P> in a header of "
                "its own (see engine/sharding/*.hpp)");
};

namespace detail {
/// A tensor of `n` elements counted under `category`.
template <class X>
Tensor<X> buffer(std::int64_t n, MemoryCategory category) {
  return Tensor<X>::empty({n}, category);
}

/// The compute-dtype parameters and the float view the modules bind to.
template <class U>
void allocate_full_params(U& u, MemoryCategory category) {
  u.full = buffer<typename decltype(u.full)::value_type>(u.layout->padded, category);
  if constexpr (U::float_compute) u.work = u.full;
  else u.work = buffer<float>(u.layout->padded, MemoryCategory::Other);
}

/// Sums `n` elements of `src` into `dst` (both of the reduce dtype, computed in float).
template <class X>
void add_into(std::span<X> dst, std::span<const X> src) {
  for (std::size_t i = 0; i < dst.size(); ++i)
    dst[i] = static_cast<X>(static_cast<float>(dst[i]) + static_cast<float>(src[i]));
}

/// The local gradients of a unit as the reduce dtype: grad_work itself when that is float, a
/// cast copy (counted under Communication) otherwise.
template <class U>
auto gradients_to_reduce(U& u) {
  using RT = typename decltype(u.reduced)::value_type;
  if constexpr (std::is_same_v<RT, float>) {
    return u.grad_work;
  } else {
    Tensor<RT> tmp = buffer<RT>(u.layout->padded, MemoryCategory::Communication);
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
    Tensor<RT> tmp = buffer<RT>(out.numel(), MemoryCategory::Communication);
    CommHandle h = comm.reduce_scatter_async(std::span<const RT>(src.span()), tmp.span(), ReduceOp::Sum);
    pending.push_back({std::move(h), [src, tmp, out, done = std::move(done)] {
                         add_into(out.span(), std::span<const RT>(tmp.span()));
                         done();
                       }});
  }
}

/// All-gathers the rank's updated shard of `full` (elements [shard_begin, +shard)) into the
/// whole of `full`, then refreshes the float view.
template <class U, class Comm>
void all_gather_updated_shard(U& u, Comm& comm) {
  using CT = typename decltype(u.full)::value_type;
  // The input is copied out first: a collective's input must not alias its output.
  Tensor<CT> mine = u.full.flat_view(u.shard_begin(), u.shard).clone(MemoryCategory::Communication);
  comm.all_gather(std::span<const CT>(mine.span()), u.full.span());
  u.refresh_work_from_full();
}
}  // namespace detail

}  // namespace polyshard
