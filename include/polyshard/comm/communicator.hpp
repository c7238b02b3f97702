// The Communicator concept: the collectives every sharding strategy is built from.
#pragma once

#include <chrono>
#include <concepts>
#include <span>
#include <type_traits>

#include "polyshard/comm/comm_handle.hpp"
#include "polyshard/comm/comm_options.hpp"
#include "polyshard/comm/comm_stats.hpp"
#include "polyshard/comm/reduce_op.hpp"
#include "polyshard/core/dtype.hpp"

namespace polyshard {

/// `C` runs every collective over contiguous buffers of element type `T`, in a blocking form and
/// an asynchronous one returning a CommHandle:
///   all_reduce(std::span<T> buf, ReduceOp)                     in place, on every rank
///   reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp)  in.size() == size() * out.size();
///                                                              rank r gets the reduced slice r
///   all_gather(std::span<const T> in, std::span<T> out)       out.size() == size() * in.size();
///                                                              slice r of out is rank r's in
///   broadcast(std::span<T> buf, int root)                      root's buf to every rank
///   reduce(std::span<T> buf, int root, ReduceOp)               reduced into root's buf; other
///                                                              ranks' buffers are left as they were
template <class C, class T>
concept CommunicatesElement = requires(C& c, std::span<T> buf, std::span<const T> in, ReduceOp op, int root) {
  c.all_reduce(buf, op);
  { c.all_reduce_async(buf, op) } -> std::same_as<CommHandle>;
  c.reduce_scatter(in, buf, op);
  { c.reduce_scatter_async(in, buf, op) } -> std::same_as<CommHandle>;
  c.all_gather(in, buf);
  { c.all_gather_async(in, buf) } -> std::same_as<CommHandle>;
  c.broadcast(buf, root);
  { c.broadcast_async(buf, root) } -> std::same_as<CommHandle>;
  c.reduce(buf, root, op);
  { c.reduce_async(buf, root, op) } -> std::same_as<CommHandle>;
};

/// A communicator: a group of `size()` ranks, this object being rank `rank()`, that runs the
/// collectives of CommunicatesElement over float, double, half and bfloat16 (the 16-bit types
/// reduce in float), a barrier, counts its traffic in a CommStats, fails a collective that
/// outlives its timeout, and splits into sub-groups as MPI_Comm_split does: the ranks passing
/// the same `color` form one group, ordered by (`key`, old rank). Every collective, and split,
/// must be called by all ranks of the group in the same order. A communicator object is used
/// by one thread at a time.
template <class C>
concept Communicator =
    std::movable<C> && CommunicatesElement<C, float> && CommunicatesElement<C, double> &&
    CommunicatesElement<C, half> && CommunicatesElement<C, bfloat16> &&
    requires(C& c, const C& cc, std::chrono::milliseconds timeout) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      c.barrier();
      { c.barrier_async() } -> std::same_as<CommHandle>;
      { c.stats() } -> std::same_as<CommStats&>;
      { cc.stats() } -> std::same_as<const CommStats&>;
      { c.split(0, 0) } -> std::same_as<C>;
      c.set_timeout(timeout);
      { cc.timeout() } -> std::same_as<std::chrono::milliseconds>;
    };

}  // namespace polyshard
