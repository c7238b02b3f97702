// In-process backend: N ranks as threads of one process, sharing memory, with ring collectives
// whose reductions are deterministic; run_ranks() launches them.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "polyshard/comm/comm_handle.hpp"
#include "polyshard/comm/comm_options.hpp"
#include "polyshard/comm/comm_stats.hpp"
#include "polyshard/comm/communicator.hpp"
#include "polyshard/comm/detail/comm_worker.hpp"
#include "polyshard/comm/detail/host_collectives.hpp"
#include "polyshard/comm/detail/ring.hpp"
#include "polyshard/comm/reduce_op.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/core/memory_tracker.hpp"

namespace polyshard {

namespace detail::comm {

class ThreadGroup;

/// What one rank publishes for the collective it is in. Written by its owner before it
/// publishes (seq, 0) in `progress`; read by the others after they see that value.
struct alignas(64) RankSlot {
  /// (sequence number of the collective << 32) | steps completed in it. Monotonic.
  std::atomic<std::uint64_t> progress{0};
  /// Peers reading (or, in reduce, writing) this rank's buffers right now.
  std::atomic<int> readers{0};
  /// Sequence number of the collective this rank left by an exception: its buffers may be freed
  /// as soon as `readers` drops to zero, so no peer may start touching them.
  std::atomic<std::uint64_t> withdrawn{0};
  CallDesc desc;
  const void* src = nullptr;  // this rank's input
  void* dst = nullptr;        // this rank's output
  int color = 0, key = 0;     // split
  std::shared_ptr<ThreadGroup> new_group;  // split: set by the lowest rank of each colour
};

constexpr std::uint64_t progress_of(std::uint64_t seq, std::uint64_t step) { return (seq << 32) | step; }

/// The memory the ranks of one in-process communicator share.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), slots_(new RankSlot[static_cast<std::size_t>(size)]) {}

  int size() const { return size_; }
  RankSlot& slot(int rank) { return slots_[static_cast<std::size_t>(rank)]; }

  /// Publishes a rank's progress and wakes whoever waits on it.
  void publish(int rank, std::uint64_t value) {
    slot(rank).progress.store(value, std::memory_order_release);
    { std::lock_guard lock(mutex_); }  // a waiter either saw the value or is inside wait_until
    cv_.notify_all();
  }

  /// Makes every waiting and future collective of the group fail with `reason` (the first
  /// reason wins: it is the cause, the later ones are its consequences).
  void abort(const std::string& reason) {
    {
      std::lock_guard lock(mutex_);
      if (!aborted_.load()) {
        reason_ = reason;
        aborted_.store(true);
      }
    }
    cv_.notify_all();
  }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() {
    std::lock_guard lock(mutex_);
    return reason_;
  }

  std::mutex& mutex() { return mutex_; }
  std::condition_variable& cv() { return cv_; }

 private:
  int size_;
  std::unique_ptr<RankSlot[]> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
};

}  // namespace detail::comm

/// One rank of an in-process communicator: N ranks are N threads of this process sharing memory.
///
/// Reductions read every rank's buffer where it lies: rank r sums chunk r of the result (the
/// buffer cut into size() chunks) as x[0] + x[1] + ... + x[N-1], left to right in the compute
/// type, so results are bit-identical on every run and every thread interleaving, equal to the
/// MPI backend's, and independent of how a caller cuts its buffers into collectives. All-reduce
/// then all-gathers the chunks around a ring. Half and bfloat16 sums stay in float until the
/// end, in blocks on the stack: the backend keeps no scratch memory.
///
/// Every call is checked against the left neighbour's: ranks calling different collectives, or
/// with different sizes, element types, roots, operators or call sites (CallSite) fail with
/// "mismatched collectives", naming both calls.
/// A rank that waits longer than timeout() fails naming the collective, itself and the ranks it
/// waited for, and fails the whole group; so does abort() (run_ranks calls it when a rank throws).
///
/// Asynchronous calls run on a communication thread of this communicator, in issue order.
class ThreadCommunicator : public detail::comm::HostCollectives<ThreadCommunicator> {
 public:
  /// Creates the `world_size` ranks of a new group; hand element r to the thread of rank r.
  static std::vector<ThreadCommunicator> make_world(int world_size, CommOptions options = {}) {
    POLYSHARD_CHECK(world_size >= 1, "polyshard: ThreadCommunicator::make_world needs at least one rank, got ",
                    world_size);
    auto group = std::make_shared<detail::comm::ThreadGroup>(world_size);
    std::vector<ThreadCommunicator> ranks;
    ranks.reserve(static_cast<std::size_t>(world_size));
    for (int r = 0; r < world_size; ++r) ranks.push_back(ThreadCommunicator(group, r, options));
    return ranks;
  }

  ThreadCommunicator(ThreadCommunicator&&) noexcept = default;
  ThreadCommunicator& operator=(ThreadCommunicator&&) noexcept = default;
  ~ThreadCommunicator() = default;

  /// This rank's index in [0, size()).
  int rank() const { return impl_->rank; }
  /// Number of ranks in the group.
  int size() const { return impl_->group->size(); }

  /// Splits the group as MPI_Comm_split does: ranks passing the same `color` (>= 0) form a new
  /// group, ranked by (`key`, rank in this group). Collective: every rank must call it.
  ThreadCommunicator split(int color, int key) {
    POLYSHARD_CHECK(color >= 0, "polyshard: split on rank ", rank(), ": colour must be >= 0, got ", color);
    std::shared_ptr<detail::comm::ThreadGroup> group;
    int new_rank = 0;
    run(CollectiveKind::Split, 0, [&] { impl_->split(color, key, group, new_rank); });
    ThreadCommunicator sub(std::move(group), new_rank, impl_->options);
    return sub;
  }

  /// Fails every collective of the group, now and later, with `reason`; what run_ranks does
  /// when a rank throws, so that the others stop waiting for it.
  void abort(const std::string& reason) { impl_->group->abort(reason); }

  /// Counters of this rank's calls and bytes sent.
  CommStats& stats() { return impl_->stats; }
  const CommStats& stats() const { return impl_->stats; }

  /// How long a collective may wait for the other ranks before it fails.
  void set_timeout(std::chrono::milliseconds timeout) { impl_->options.timeout = timeout; }
  std::chrono::milliseconds timeout() const { return impl_->options.timeout; }

  /// Where a backend counts the scratch buffers it keeps (the Communicator interface's): the
  /// in-process backend keeps none (every reduction reads the ranks' buffers where they lie and
  /// sums in blocks on the stack), so there is nothing to count.
  void set_memory_tracker(MemoryTracker&) {}

 private:
  friend class detail::comm::HostCollectives<ThreadCommunicator>;  // calls run, submit and impl_
  using Group = detail::comm::ThreadGroup;
  using CallDesc = detail::comm::CallDesc;
  using Chunks = detail::comm::Chunks;

  struct Impl {
    std::shared_ptr<Group> group;
    int rank;
    CommOptions options;
    CommStats stats;
    std::uint64_t seq = 0;  // collectives run so far; touched only by the thread running them
    CallDesc current;
    std::chrono::steady_clock::time_point deadline;
    // Declared last: destroyed first, so the queue drains while everything above still exists.
    detail::comm::CommWorker worker;

    Impl(std::shared_ptr<Group> g, int r, CommOptions o) : group(std::move(g)), rank(r), options(o) {}

    int n() const { return group->size(); }
    /// Counts bytes this rank copied from or into another rank's memory (measured traffic).
    void moved(std::uint64_t bytes) { stats.record_moved(current.kind, static_cast<double>(bytes)); }
    int left() const { return detail::comm::wrap(rank - 1, n()); }
    int right() const { return detail::comm::wrap(rank + 1, n()); }
    detail::comm::RankSlot& mine() { return group->slot(rank); }
    detail::comm::RankSlot& of(int r) { return group->slot(r); }

    std::string where() const {
      return "polyshard: " + detail::comm::describe(current) + " on rank " + std::to_string(rank) + " of " +
             std::to_string(n()) + " (in-process)";
    }

    [[noreturn]] void fail_aborted(int peer) {
      throw Error(where() + " failed while waiting for rank " + std::to_string(peer) + ": " + group->abort_reason());
    }

    /// Blocks until rank `peer` has published at least `target`, the group aborts, or the
    /// deadline passes.
    void wait_for(int peer, std::uint64_t target) {
      auto& progress = of(peer).progress;
      // A short spin that yields, then sleep on the condition variable. Measured on a 2-core VM:
      // longer spins, or spins without yielding, make ring steps slower, since a spinning rank
      // takes the core from the rank it waits for whenever the machine is busy.
      for (int i = 0; i < 64; ++i) {
        if (progress.load(std::memory_order_acquire) >= target) return;
        if (group->aborted()) fail_aborted(peer);
        std::this_thread::yield();
      }
      std::unique_lock lock(group->mutex());
      while (progress.load(std::memory_order_acquire) < target) {
        if (group->aborted()) {
          lock.unlock();
          fail_aborted(peer);
        }
        if (group->cv().wait_until(lock, deadline) == std::cv_status::timeout &&
            progress.load(std::memory_order_acquire) < target && !group->aborted()) {
          std::vector<int> absent;
          const std::uint64_t entered = detail::comm::progress_of(seq, 0);
          for (int q = 0; q < n(); ++q)
            if (q != rank && of(q).progress.load(std::memory_order_acquire) < entered) absent.push_back(q);
          std::string message = where() + " timed out after " + detail::comm::seconds_text(options.timeout) +
                                " waiting for rank " + std::to_string(peer);
          if (!absent.empty()) message += " (" + detail::comm::rank_list(absent) + " never entered this collective)";
          lock.unlock();
          group->abort(message);
          throw Error(message);
        }
      }
    }
    void wait_all(std::uint64_t target) {
      for (int q = 0; q < n(); ++q)
        if (q != rank) wait_for(q, target);
    }
    void publish(std::uint64_t step) { group->publish(rank, detail::comm::progress_of(seq, step)); }

    /// Announces that this rank touches rank `peer`'s memory until release(peer); fails if `peer`
    /// has left this collective by an exception (its buffers may be gone).
    void acquire(int peer) {
      auto& s = of(peer);
      s.readers.fetch_add(1, std::memory_order_seq_cst);
      if (s.withdrawn.load(std::memory_order_seq_cst) == seq) {
        s.readers.fetch_sub(1, std::memory_order_release);
        if (!group->aborted()) group->abort("rank " + std::to_string(peer) + " left " + detail::comm::describe(current));
        fail_aborted(peer);
      }
    }
    void release(int peer) { of(peer).readers.fetch_sub(1, std::memory_order_release); }

    /// Copies `bytes` between this rank's memory and `peer`'s, holding the peer's buffers while
    /// it copies, and counts as moved the bytes it handed to the copy: the measured traffic is
    /// what was copied, not a figure written beside it.
    void copy_with(int peer, void* to, const void* from, std::size_t bytes) {
      acquire(peer);
      if (bytes) std::memcpy(to, from, bytes);
      release(peer);
      moved(bytes);
    }

    /// Runs one collective; if it throws, first withdraws this rank's buffers: marks them gone
    /// and waits until no peer is inside a step that reads them (steps never block, so this is
    /// short), so that the caller may free them as soon as the exception reaches it.
    template <class F>
    void guarded(F& body) {
      try {
        body();
      } catch (...) {
        auto& s = mine();
        s.withdrawn.store(seq, std::memory_order_seq_cst);
        while (s.readers.load(std::memory_order_acquire) != 0) std::this_thread::yield();
        throw;
      }
    }

    /// Opens collective number seq: publishes the call and its buffers, then checks the call
    /// against the left neighbour's. Any mismatch is seen by at least one rank of every
    /// mismatched pair; that rank aborts the group, which fails all the others.
    void enter(const CallDesc& desc, const void* src, void* dst) {
      ++seq;
      current = desc;
      deadline = std::chrono::steady_clock::now() + options.timeout;
      if (group->aborted()) throw Error(where() + " cannot run: " + group->abort_reason());
      auto& s = mine();
      s.desc = desc;
      s.src = src;
      s.dst = dst;
      publish(0);
      if (n() == 1) return;
      wait_for(left(), detail::comm::progress_of(seq, 0));
      const CallDesc& theirs = of(left()).desc;
      if (!theirs.same_call(desc)) {
        const std::string message = "polyshard: mismatched collectives (in-process): rank " + std::to_string(rank) +
                                    " of " + std::to_string(n()) + " called " + detail::comm::describe(desc) +
                                    " but rank " + std::to_string(left()) + " called " +
                                    detail::comm::describe(theirs);
        group->abort(message);
        throw Error(message);
      }
    }

    /// Root-based collectives touch ranks other than the left neighbour, whose calls this rank
    /// has not compared: wait until every rank has compared its own (step 1), so that all calls
    /// are known to match before any buffer is touched.
    void validated() {
      publish(1);
      wait_all(detail::comm::progress_of(seq, 1));
    }

    template <class T>
    static CallDesc call(CollectiveKind kind, std::uint64_t count, int root = -1, ReduceOp op = ReduceOp::Sum) {
      return CallDesc{kind, dtype_v<T>, count, root, op};
    }

    /// This rank's share of a reduce-scatter: chunk `rank` of the reduction, summed in rank order
    /// from every rank's input read where it lies, into `out`. Every rank must have validated
    /// the call (all inputs are published), and must wait for the others before its own input
    /// may change.
    template <class T>
    void sum_own_chunk(T* out, Chunks chunks, ReduceOp op) {
      const int N = n();
      std::vector<const T*> parts(static_cast<std::size_t>(N));
      for (int q = 0; q < N; ++q) {
        if (q != rank) acquire(q);
        parts[static_cast<std::size_t>(q)] = static_cast<const T*>(of(q).src) + chunks.begin(rank);
      }
      detail::comm::sum_in_rank_order<compute_t<T>>(out, parts.data(), N, chunks.size(rank),
                                                    op == ReduceOp::Avg ? N : 1);
      for (int q = 0; q < N; ++q)
        if (q != rank) release(q);
      moved(chunks.size(rank) * sizeof(T) * static_cast<std::uint64_t>(N - 1));
    }

    template <class T>
    void all_reduce(std::span<T> buf, ReduceOp op) {
      const int N = n();
      enter(call<T>(CollectiveKind::AllReduce, buf.size(), -1, op), buf.data(), buf.data());
      if (N == 1) return;  // a sum or average over one rank is the buffer itself
      validated();
      const Chunks chunks{buf.size(), N};
      T* data = buf.data();
      // In place: this rank writes only its own chunk, which no other rank reads.
      sum_own_chunk<T>(data + chunks.begin(rank), chunks, op);
      publish(2);
      wait_all(detail::comm::progress_of(seq, 2));  // no rank reads an input any more
      // Ring all-gather: step t copies chunk (rank - 1 - t), which the left neighbour reduced
      // (t = 0) or copied in its step t - 1.
      for (int t = 0; t <= N - 2; ++t) {
        wait_for(left(), detail::comm::progress_of(seq, static_cast<std::uint64_t>(2 + t)));
        const int c = detail::comm::wrap(rank - 1 - t, N);
        const T* from = static_cast<const T*>(of(left()).dst) + chunks.begin(c);
        copy_with(left(), data + chunks.begin(c), from, chunks.size(c) * sizeof(T));
        publish(static_cast<std::uint64_t>(3 + t));
      }
      // The right neighbour reads this buffer until its last step.
      wait_for(right(), detail::comm::progress_of(seq, static_cast<std::uint64_t>(N + 1)));
    }

    template <class T>
    void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op) {
      using C = compute_t<T>;
      const int N = n();
      enter(call<T>(CollectiveKind::ReduceScatter, in.size(), -1, op), in.data(), out.data());
      if (N == 1) {
        detail::comm::convert<C>(out.data(), in.data(), out.size());
        return;
      }
      validated();
      sum_own_chunk<T>(out.data(), Chunks{in.size(), N}, op);
      publish(2);
      wait_all(detail::comm::progress_of(seq, 2));  // the others have read this rank's input
    }

    template <class T>
    void all_gather(std::span<const T> in, std::span<T> out) {
      const int N = n();
      const std::uint64_t m = in.size();
      enter(call<T>(CollectiveKind::AllGather, m), in.data(), out.data());
      if (m) std::memcpy(out.data() + m * static_cast<std::uint64_t>(rank), in.data(), m * sizeof(T));
      if (N == 1) return;
      publish(1);
      for (int t = 0; t <= N - 2; ++t) {
        wait_for(left(), detail::comm::progress_of(seq, static_cast<std::uint64_t>(1 + t)));
        const std::uint64_t b = m * static_cast<std::uint64_t>(detail::comm::wrap(rank - 1 - t, N));
        copy_with(left(), out.data() + b, static_cast<const T*>(of(left()).dst) + b, m * sizeof(T));
        publish(static_cast<std::uint64_t>(2 + t));
      }
      wait_for(right(), detail::comm::progress_of(seq, static_cast<std::uint64_t>(N)));
    }

    template <class T>
    void broadcast(std::span<T> buf, int root) {
      enter(call<T>(CollectiveKind::Broadcast, buf.size(), root), buf.data(), buf.data());
      if (n() == 1) return;
      validated();
      if (rank != root) copy_with(root, buf.data(), of(root).dst, buf.size_bytes());
      publish(2);
      wait_all(detail::comm::progress_of(seq, 2));
    }

    /// Every rank reduces its own chunk of the result, reading that chunk of every rank's
    /// buffer in rank order, and writes it into the root's buffer.
    template <class T>
    void reduce(std::span<T> buf, int root, ReduceOp op) {
      const int N = n();
      enter(call<T>(CollectiveKind::Reduce, buf.size(), root, op), buf.data(), buf.data());
      if (N == 1) return;
      validated();
      const Chunks chunks{buf.size(), N};
      // sum_own_chunk holds every other rank's buffers, the root's among them, while it writes.
      sum_own_chunk<T>(static_cast<T*>(of(root).dst) + chunks.begin(rank), chunks, op);
      // Read: chunk `rank` of every other rank's input; written: the chunk into the root's buffer.
      if (rank != root) moved(chunks.size(rank) * sizeof(T));
      publish(2);
      wait_all(detail::comm::progress_of(seq, 2));
    }

    void barrier() {
      enter(CallDesc{CollectiveKind::Barrier, DType::F32, 0, -1, ReduceOp::Sum}, nullptr, nullptr);
      if (n() == 1) return;
      publish(1);
      wait_all(detail::comm::progress_of(seq, 1));
    }

    void split(int color, int key, std::shared_ptr<Group>& out_group, int& out_rank) {
      mine().color = color;
      mine().key = key;
      enter(CallDesc{CollectiveKind::Split, DType::F32, 0, -1, ReduceOp::Sum}, nullptr, nullptr);
      wait_all(detail::comm::progress_of(seq, 0));
      std::vector<std::pair<int, int>> members;  // (key, old rank) of my colour
      for (int q = 0; q < n(); ++q)
        if (of(q).color == color) members.emplace_back(of(q).key, q);
      std::sort(members.begin(), members.end());
      const int leader = members.front().second;
      for (std::size_t i = 0; i < members.size(); ++i)
        if (members[i].second == rank) out_rank = static_cast<int>(i);
      if (leader == rank) mine().new_group = std::make_shared<Group>(static_cast<int>(members.size()));
      publish(1);
      wait_for(leader, detail::comm::progress_of(seq, 1));
      out_group = of(leader).new_group;
      publish(2);
      wait_all(detail::comm::progress_of(seq, 2));
      if (leader == rank) mine().new_group.reset();  // everyone holds it now
    }
  };

  ThreadCommunicator(std::shared_ptr<Group> group, int rank, CommOptions options)
      : impl_(std::make_unique<Impl>(std::move(group), rank, options)) {}

  template <class F>
  void run(CollectiveKind kind, std::size_t buffer_bytes, F&& body) {
    impl_->stats.record(kind, ring_bytes_sent(kind, buffer_bytes, size()));
    impl_->worker.run([impl = impl_.get(), body = std::forward<F>(body)]() mutable { impl->guarded(body); });
  }
  template <class F>
  CommHandle submit(CollectiveKind kind, std::size_t buffer_bytes, F&& body) {
    impl_->stats.record(kind, ring_bytes_sent(kind, buffer_bytes, size()));
    return impl_->worker.submit([impl = impl_.get(), body = std::forward<F>(body)]() mutable { impl->guarded(body); });
  }

  std::unique_ptr<Impl> impl_;
};

static_assert(Communicator<ThreadCommunicator>);

/// Runs `body(ThreadCommunicator&)` on `world_size` ranks, one thread each, and returns when all
/// have finished. If any rank throws, the group is aborted (the other ranks' collectives fail at
/// once instead of waiting) and the first exception thrown is rethrown here.
template <class Body>
void run_ranks(int world_size, Body&& body, CommOptions options = {}) {
  auto comms = ThreadCommunicator::make_world(world_size, options);
  std::mutex mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator& comm = comms[static_cast<std::size_t>(r)];
      try {
        body(comm);
      } catch (...) {
        std::string what = "an exception";
        try {
          throw;
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        {
          std::lock_guard lock(mutex);
          if (!first) first = std::current_exception();
        }
        comm.abort("rank " + std::to_string(r) + " failed: " + what);
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace polyshard
