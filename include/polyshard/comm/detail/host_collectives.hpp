// The collectives of the host backends (ThreadCommunicator, MpiCommunicator), written once: the
// argument checks every rank makes before it enters a call, then the backend's own run or
// submit of its implementation's collective. The backends differ in how they move bytes, not in
// what a call means.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "polyshard/comm/comm_handle.hpp"
#include "polyshard/comm/comm_stats.hpp"
#include "polyshard/comm/detail/ring.hpp"
#include "polyshard/comm/reduce_op.hpp"
#include "polyshard/core/dtype.hpp"

namespace polyshard::detail::comm {

/// Base of a host communicator `Backend` (CRTP), which provides rank(), size(), and privately
/// (befriending this class) impl_, whose all_reduce, reduce_scatter, all_gather, broadcast,
/// reduce and barrier move the bytes, and run(kind, bytes, body) / submit(kind, bytes, body),
/// which record the call and run the body now / on the communication thread.
template <class Backend>
class HostCollectives {
 public:
  /// Sums (or averages) `buf` over all ranks, in place, on every rank.
  template <FloatElement T>
  void all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::Sum) {
    self().run(CollectiveKind::AllReduce, buf.size_bytes(), [=, impl = impl_ptr()] { impl->all_reduce(buf, op); });
  }
  /// all_reduce() on the communication thread; wait on the handle before touching `buf`.
  template <FloatElement T>
  CommHandle all_reduce_async(std::span<T> buf, ReduceOp op = ReduceOp::Sum) {
    return self().submit(CollectiveKind::AllReduce, buf.size_bytes(),
                         [=, impl = impl_ptr()] { impl->all_reduce(buf, op); });
  }

  /// Reduces `in` (size() x out.size() elements) over all ranks; rank r receives slice r.
  template <FloatElement T>
  void reduce_scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, ReduceOp op = ReduceOp::Sum) {
    check_scatter(in.size(), out.size());
    self().run(CollectiveKind::ReduceScatter, in.size_bytes(),
               [=, impl = impl_ptr()] { impl->reduce_scatter(in, out, op); });
  }
  template <FloatElement T>
  CommHandle reduce_scatter_async(std::type_identity_t<std::span<const T>> in, std::span<T> out,
                                  ReduceOp op = ReduceOp::Sum) {
    check_scatter(in.size(), out.size());
    return self().submit(CollectiveKind::ReduceScatter, in.size_bytes(),
                         [=, impl = impl_ptr()] { impl->reduce_scatter(in, out, op); });
  }

  /// Concatenates every rank's `in` into `out` (size() x in.size() elements), rank order.
  template <FloatElement T>
  void all_gather(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    check_gather(in.size(), out.size());
    self().run(CollectiveKind::AllGather, out.size_bytes(), [=, impl = impl_ptr()] { impl->all_gather(in, out); });
  }
  template <FloatElement T>
  CommHandle all_gather_async(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    check_gather(in.size(), out.size());
    return self().submit(CollectiveKind::AllGather, out.size_bytes(),
                         [=, impl = impl_ptr()] { impl->all_gather(in, out); });
  }

  /// Copies `root`'s `buf` into every rank's `buf`.
  template <FloatElement T>
  void broadcast(std::span<T> buf, int root) {
    check_root(CollectiveKind::Broadcast, root, self().size(), self().rank());
    self().run(CollectiveKind::Broadcast, buf.size_bytes(), [=, impl = impl_ptr()] { impl->broadcast(buf, root); });
  }
  template <FloatElement T>
  CommHandle broadcast_async(std::span<T> buf, int root) {
    check_root(CollectiveKind::Broadcast, root, self().size(), self().rank());
    return self().submit(CollectiveKind::Broadcast, buf.size_bytes(),
                         [=, impl = impl_ptr()] { impl->broadcast(buf, root); });
  }

  /// Sums (or averages) every rank's `buf` into `root`'s `buf`; the others keep theirs.
  template <FloatElement T>
  void reduce(std::span<T> buf, int root, ReduceOp op = ReduceOp::Sum) {
    check_root(CollectiveKind::Reduce, root, self().size(), self().rank());
    self().run(CollectiveKind::Reduce, buf.size_bytes(), [=, impl = impl_ptr()] { impl->reduce(buf, root, op); });
  }
  template <FloatElement T>
  CommHandle reduce_async(std::span<T> buf, int root, ReduceOp op = ReduceOp::Sum) {
    check_root(CollectiveKind::Reduce, root, self().size(), self().rank());
    return self().submit(CollectiveKind::Reduce, buf.size_bytes(),
                         [=, impl = impl_ptr()] { impl->reduce(buf, root, op); });
  }

  /// Returns once every rank has entered the barrier.
  void barrier() {
    self().run(CollectiveKind::Barrier, 0, [impl = impl_ptr()] { impl->barrier(); });
  }
  CommHandle barrier_async() {
    return self().submit(CollectiveKind::Barrier, 0, [impl = impl_ptr()] { impl->barrier(); });
  }

 private:
  Backend& self() { return static_cast<Backend&>(*this); }
  auto* impl_ptr() { return self().impl_.get(); }

  void check_scatter(std::size_t in, std::size_t out) {
    check_multiple(CollectiveKind::ReduceScatter, in, out, self().size(), self().rank(), "the input", "the output");
  }
  void check_gather(std::size_t in, std::size_t out) {
    check_multiple(CollectiveKind::AllGather, out, in, self().size(), self().rank(), "the output", "the input");
  }
};

}  // namespace polyshard::detail::comm
