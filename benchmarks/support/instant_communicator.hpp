// A communicator whose collectives complete at once without communicating: the step time of a
// run with communication removed, against which the overlapped run is measured. Its results are
// wrong on purpose (every rank keeps its own data), so only timings may be read from such a run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>

#include "polyshard/comm/communicator.hpp"

namespace bench {

using polyshard::CollectiveKind, polyshard::CommHandle, polyshard::CommStats, polyshard::FloatElement,
    polyshard::ReduceOp;

class InstantCommunicator {
 public:
  InstantCommunicator(int rank, int size) : rank_(rank), size_(size) {}

  int rank() const { return rank_; }
  int size() const { return size_; }

  template <FloatElement T>
  void all_reduce(std::span<T> buf, ReduceOp = ReduceOp::Sum) {
    count(CollectiveKind::AllReduce, buf.size_bytes());
  }
  template <FloatElement T>
  CommHandle all_reduce_async(std::span<T> buf, ReduceOp op = ReduceOp::Sum) {
    all_reduce(buf, op);
    return {};
  }
  /// Keeps this rank's own slice of its input, as if the others had sent zeros.
  template <FloatElement T>
  void reduce_scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, ReduceOp = ReduceOp::Sum) {
    count(CollectiveKind::ReduceScatter, in.size_bytes());
    std::memcpy(out.data(), in.data() + out.size() * static_cast<std::size_t>(rank_), out.size_bytes());
  }
  template <FloatElement T>
  CommHandle reduce_scatter_async(std::type_identity_t<std::span<const T>> in, std::span<T> out,
                                  ReduceOp op = ReduceOp::Sum) {
    reduce_scatter<T>(in, out, op);
    return {};
  }
  /// Puts this rank's input in its slice; the other slices keep what they held.
  template <FloatElement T>
  void all_gather(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    count(CollectiveKind::AllGather, out.size_bytes());
    std::memcpy(out.data() + in.size() * static_cast<std::size_t>(rank_), in.data(), in.size_bytes());
  }
  template <FloatElement T>
  CommHandle all_gather_async(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    all_gather<T>(in, out);
    return {};
  }
  template <FloatElement T>
  void broadcast(std::span<T> buf, int) {
    count(CollectiveKind::Broadcast, buf.size_bytes());
  }
  template <FloatElement T>
  CommHandle broadcast_async(std::span<T> buf, int root) {
    broadcast(buf, root);
    return {};
  }
  template <FloatElement T>
  void reduce(std::span<T> buf, int, ReduceOp = ReduceOp::Sum) {
    count(CollectiveKind::Reduce, buf.size_bytes());
  }
  template <FloatElement T>
  CommHandle reduce_async(std::span<T> buf, int root, ReduceOp op = ReduceOp::Sum) {
    reduce(buf, root, op);
    return {};
  }
  void barrier() {}
  CommHandle barrier_async() { return {}; }
  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }
  InstantCommunicator split(int, int) { return *this; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  void count(CollectiveKind kind, std::size_t bytes) {
    stats_.record(kind, polyshard::ring_bytes_sent(kind, static_cast<double>(bytes), size_));
  }

  int rank_, size_;
  CommStats stats_;
  std::chrono::milliseconds timeout_{300'000};
};
static_assert(polyshard::Communicator<InstantCommunicator>);

}  // namespace bench
