// MPI backend: ranks are processes started by mpirun (or a scheduler's launcher), buffers live in
// host memory. Also the bootstrap of the NCCL backend. Needs <mpi.h> and MPI::MPI_CXX.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "polyshard/comm/comm_handle.hpp"
#include "polyshard/comm/comm_options.hpp"
#include "polyshard/comm/comm_stats.hpp"
#include "polyshard/comm/communicator.hpp"
#include "polyshard/comm/detail/comm_worker.hpp"
#include "polyshard/comm/detail/host_collectives.hpp"
#include "polyshard/comm/detail/ring.hpp"
#include "polyshard/comm/detail/scratch.hpp"
#include "polyshard/comm/reduce_op.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/core/memory_tracker.hpp"

namespace polyshard {

namespace detail::comm {

/// Process-wide MPI state: whether MPI calls need a lock (no MPI_THREAD_MULTIPLE), and the first
/// failure (timeout or MPI error) after which the job can only be aborted.
struct MpiState {
  std::atomic<int> thread_level{MPI_THREAD_SINGLE};
  std::mutex call_mutex;
  std::mutex failure_mutex;
  std::atomic<bool> failed{false};
  std::string failure;

  static MpiState& get() {
    static MpiState state;
    return state;
  }
  void record_failure(const std::string& message) {
    std::lock_guard lock(failure_mutex);
    if (!failed.load()) {
      failure = message;
      failed.store(true);
    }
  }
};

/// Serializes MPI calls when the library was initialized below MPI_THREAD_MULTIPLE.
class MpiLock {
 public:
  MpiLock() {
    if (MpiState::get().thread_level.load() < MPI_THREAD_MULTIPLE) lock_.emplace(MpiState::get().call_mutex);
  }

 private:
  std::optional<std::unique_lock<std::mutex>> lock_;
};

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

/// Largest message posted at once: MPI counts are int.
inline constexpr std::size_t mpi_max_message = std::size_t{1} << 30;

}  // namespace detail::comm

/// Initializes MPI for the lifetime of the object (MPI_THREAD_MULTIPLE requested, so that the
/// communication threads of asynchronous calls may call MPI), and finalizes it at the end,
/// unless a collective failed: then the job cannot finish cleanly, and the destructor ends it
/// with MPI_Abort and a message instead of hanging in MPI_Finalize. Does nothing when MPI was
/// already initialized by someone else (who then also finalizes it).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
      POLYSHARD_CHECK(rc == MPI_SUCCESS, "polyshard: MPI_Init_thread failed");
      owner_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    detail::comm::MpiState::get().thread_level.store(provided);
    // Errors come back as return codes, which the communicators turn into polyshard::Error.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession() {
    if (!owner_) return;
    auto& state = detail::comm::MpiState::get();
    if (state.failed.load()) abort(state.failure);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  /// True once a collective of this process failed (timed out or met an MPI error).
  static bool failed() { return detail::comm::MpiState::get().failed.load(); }

  /// Ends the whole job: prints "polyshard: aborting the MPI job: <why>" and calls MPI_Abort.
  [[noreturn]] static void abort(const std::string& why, int code = 1) {
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "polyshard: aborting the MPI job from rank %d: %s\n", rank, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
  }

 private:
  bool owner_ = false;
};

/// One rank of an MPI communicator over host buffers.
///
/// Reduce-scatter sends chunk q of every rank's buffer to rank q, which adds them in rank order,
/// with the same chunks and the same order of additions as ThreadCommunicator, so both backends
/// give bit-identical results; half and bfloat16 travel as they are and are added in float.
/// All-reduce is that reduce-scatter, then a ring all-gather of MPI_Isend/MPI_Irecv; reduce is
/// the reduce-scatter followed by a gather of the chunks at the root; broadcast and barrier use
/// MPI_Ibcast and MPI_Ibarrier.
///
/// Every wait polls its requests against the deadline: a collective that outlives timeout() throws
/// polyshard::Error naming the collective, this rank and the ranks it waited for, and marks the
/// process failed (MpiSession then aborts the job rather than hang). MPI errors (a dead peer, for
/// one) are returned, not fatal, and are reported the same way; a rank that exits ends the job
/// through the launcher. Unless CommOptions::check_calls is off, every call is first compared
/// across the ranks (an MPI_Iallgather of its description and its CallSite's hash, 56 bytes a
/// rank) and mismatched calls throw on every rank, naming every rank's call and site; every later
/// call on that communicator then fails at once (the ranks' queues no longer line up), as in the
/// in-process backend.
///
/// Asynchronous calls run on a communication thread of this communicator, in issue order.
class MpiCommunicator : public detail::comm::HostCollectives<MpiCommunicator> {
 public:
  /// The call check's message: kind, element type, count, root, operator, sequence number and
  /// the hash of the call site, each an int64.
  static constexpr int check_words = 7;

  /// A communicator over all processes of the job (a duplicate of MPI_COMM_WORLD, so that its
  /// messages never meet the application's own).
  static MpiCommunicator world(CommOptions options = {}) { return MpiCommunicator(MPI_COMM_WORLD, options); }

  /// A communicator over the processes of `comm`, which it duplicates (the caller keeps `comm`).
  explicit MpiCommunicator(MPI_Comm comm, CommOptions options = {}) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    POLYSHARD_CHECK(initialized, "polyshard: MpiCommunicator needs MPI to be initialized (create an MpiSession first)");
    MPI_Comm dup = MPI_COMM_NULL;
    {
      detail::comm::MpiLock lock;
      const int rc = MPI_Comm_dup(comm, &dup);
      POLYSHARD_CHECK(rc == MPI_SUCCESS, "polyshard: MPI_Comm_dup failed: ", detail::comm::mpi_error_text(rc));
    }
    impl_ = std::make_unique<Impl>(dup, options);
  }

  MpiCommunicator(MpiCommunicator&&) noexcept = default;
  MpiCommunicator& operator=(MpiCommunicator&&) noexcept = default;
  ~MpiCommunicator() = default;

  int rank() const { return impl_->rank; }
  int size() const { return impl_->size; }
  /// The underlying MPI communicator (owned by this object).
  MPI_Comm native() const { return impl_->comm; }

  /// MPI_Comm_split: ranks passing the same `color` (>= 0) form a new communicator, ranked by
  /// (`key`, rank here). Collective. Unlike the collectives it is not bounded by the timeout.
  MpiCommunicator split(int color, int key) {
    POLYSHARD_CHECK(color >= 0, "polyshard: split on rank ", rank(), ": colour must be >= 0, got ", color);
    MPI_Comm sub = MPI_COMM_NULL;
    run(CollectiveKind::Split, 0, [&] {
      detail::comm::MpiLock lock;
      impl_->check(MPI_Comm_split(impl_->comm, color, key, &sub), "MPI_Comm_split");
    });
    MpiCommunicator result(std::make_unique<Impl>(sub, impl_->options));
    result.set_memory_tracker(*impl_->tracker);
    return result;
  }

  /// Counters of this rank's calls and bytes sent (by the ring formula, as every backend).
  CommStats& stats() { return impl_->stats; }
  const CommStats& stats() const { return impl_->stats; }

  void set_timeout(std::chrono::milliseconds timeout) { impl_->options.timeout = timeout; }
  std::chrono::milliseconds timeout() const { return impl_->options.timeout; }
  /// Turns the cross-rank check of every call (CommOptions::check_calls) on or off.
  void set_check_calls(bool on) { impl_->options.check_calls = on; }
  bool check_calls() const { return impl_->options.check_calls; }
  /// What the check adds to every collective on more than one rank: this many bytes from each
  /// rank to each other rank (counted in bytes_moved: N-1 times this a rank).
  static constexpr std::size_t call_check_bytes = check_words * sizeof(std::int64_t);

  /// Counts scratch buffers under MemoryCategory::Communication in `tracker`.
  void set_memory_tracker(MemoryTracker& tracker) {
    for (auto* s : {&impl_->recv_scratch, &impl_->out_scratch}) s->set_tracker(&tracker);
    impl_->tracker = &tracker;
  }

 private:
  friend class detail::comm::HostCollectives<MpiCommunicator>;  // calls run, submit and impl_
  using CallDesc = detail::comm::CallDesc;
  using Chunks = detail::comm::Chunks;
  static constexpr int ring_tag = 0x5053;  // "PS"
  static constexpr int reduce_tag = 0x5054;
  static constexpr int check_tag = 0x5055;
  /// Up to this many ranks the call check is point-to-point (N-1 messages a rank, naming a dead
  /// peer on a timeout); above it, one all-gather (log-depth, naming no rank in particular).
  static constexpr int check_by_messages_up_to = 64;

  /// Frees the MPI communicator last, after the communication thread has drained.
  struct OwnedComm {
    MPI_Comm comm = MPI_COMM_NULL;
    explicit OwnedComm(MPI_Comm c) : comm(c) {}
    OwnedComm(const OwnedComm&) = delete;
    OwnedComm& operator=(const OwnedComm&) = delete;
    ~OwnedComm() {
      // After a failure requests may still point into this communicator: leave it to MPI_Abort.
      if (comm == MPI_COMM_NULL || detail::comm::MpiState::get().failed.load()) return;
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return;
      detail::comm::MpiLock lock;
      MPI_Comm_free(&comm);
    }
  };

  struct Impl {
    OwnedComm owned;
    MPI_Comm comm;
    int rank = 0;
    int size = 1;
    CommOptions options;
    CommStats stats;
    MemoryTracker* tracker = &current_memory_tracker();
    detail::comm::Scratch recv_scratch{tracker};
    detail::comm::Scratch out_scratch{tracker};
    std::uint64_t seq = 0;
    CallDesc current;
    std::string mismatch;  // the report of a mismatched call: the communicator is unusable after it
    std::chrono::steady_clock::time_point deadline;
    std::vector<MPI_Request> requests;
    std::vector<int> request_peers;  // the rank each request waits on; any_peer for a collective's
    detail::comm::CommWorker worker;  // last: destroyed (drained) first

    Impl(MPI_Comm c, CommOptions o) : owned(c), comm(c), options(o) {
      detail::comm::MpiLock lock;
      MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
      MPI_Comm_rank(comm, &rank);
      MPI_Comm_size(comm, &size);
    }

    int left() const { return detail::comm::wrap(rank - 1, size); }
    int right() const { return detail::comm::wrap(rank + 1, size); }

    std::string where() const {
      return "polyshard: " + detail::comm::describe(current) + " on rank " + std::to_string(rank) + " of " +
             std::to_string(size) + " (MPI)";
    }

    [[noreturn]] void fail(const std::string& message) {
      detail::comm::MpiState::get().record_failure(message);
      throw Error(message);
    }
    void check(int rc, const char* call) {
      if (rc != MPI_SUCCESS) fail(where() + ": " + call + " failed: " + detail::comm::mpi_error_text(rc));
    }

    void post_send(const void* data, std::size_t bytes, int peer, int tag) {
      const auto* p = static_cast<const char*>(data);
      do {
        const std::size_t len = std::min(bytes, detail::comm::mpi_max_message);
        MPI_Request r;
        detail::comm::MpiLock lock;
        check(MPI_Isend(p, static_cast<int>(len), MPI_BYTE, peer, tag, comm, &r), "MPI_Isend");
        stats.record_moved(current.kind, static_cast<double>(len));
        add_request(r, peer);
        p += len;
        bytes -= len;
      } while (bytes > 0);
    }
    void post_recv(void* data, std::size_t bytes, int peer, int tag) {
      auto* p = static_cast<char*>(data);
      do {
        const std::size_t len = std::min(bytes, detail::comm::mpi_max_message);
        MPI_Request r;
        detail::comm::MpiLock lock;
        check(MPI_Irecv(p, static_cast<int>(len), MPI_BYTE, peer, tag, comm, &r), "MPI_Irecv");
        add_request(r, peer);
        p += len;
        bytes -= len;
      } while (bytes > 0);
    }

    static constexpr int any_peer = -1;
    void add_request(MPI_Request r, int peer) {
      requests.push_back(r);
      request_peers.push_back(peer);
    }

    /// The ranks whose requests have not completed (after MPI_Testall said some have not): a
    /// point-to-point request names its peer, a collective's every other rank.
    std::vector<int> waited_for() {
      std::vector<int> peers;
      for (std::size_t i = 0; i < requests.size(); ++i) {
        int done = 0;
        if (requests[i] != MPI_REQUEST_NULL) {
          detail::comm::MpiLock lock;
          MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE);
        }
        if (done || requests[i] == MPI_REQUEST_NULL) continue;
        if (request_peers[i] != any_peer) {
          peers.push_back(request_peers[i]);
          continue;
        }
        for (int q = 0; q < size; ++q)
          if (q != rank) peers.push_back(q);
      }
      std::sort(peers.begin(), peers.end());
      peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
      return peers;
    }

    /// Polls the posted requests until all completed, failing at the deadline with the ranks
    /// whose messages are still missing. MPI progresses messages only inside its calls, so the
    /// loop keeps calling MPI_Testall; it yields the core after a while and sleeps briefly once
    /// the wait is long (oversubscribed ranks).
    void wait() {
      const auto start = std::chrono::steady_clock::now();
      for (long spins = 0;; ++spins) {
        int done = 0;
        {
          detail::comm::MpiLock lock;
          check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
                "MPI_Testall");
        }
        if (done) {
          requests.clear();
          request_peers.clear();
          return;
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
          const std::vector<int> missing = waited_for();
          requests.clear();  // left pending: the job cannot go on, MpiSession will abort it
          request_peers.clear();
          fail(where() + " timed out after " + detail::comm::seconds_text(options.timeout) + " waiting for " +
               detail::comm::rank_list(missing));
        }
        if (now - start > std::chrono::milliseconds(20)) std::this_thread::sleep_for(std::chrono::microseconds(50));
        else if (spins > 256) std::this_thread::yield();
      }
    }

    /// Starts collective number seq; unless check_calls is off, compares the call across all
    /// ranks first.
    void enter(const CallDesc& desc) {
      ++seq;
      current = desc;
      deadline = std::chrono::steady_clock::now() + options.timeout;
      POLYSHARD_CHECK(!detail::comm::MpiState::get().failed.load(), where(),
                      " cannot run: an earlier collective failed: ", detail::comm::MpiState::get().failure);
      POLYSHARD_CHECK(mismatch.empty(), where(), " cannot run: an earlier call on this communicator did not match "
                                                 "across the ranks (", mismatch, ")");
      if (!options.check_calls || size == 1) return;
      const std::array<std::int64_t, check_words> mine{
          static_cast<std::int64_t>(desc.kind), static_cast<std::int64_t>(desc.dtype),
          static_cast<std::int64_t>(desc.count), desc.root, static_cast<std::int64_t>(desc.op),
          static_cast<std::int64_t>(seq), static_cast<std::int64_t>(detail::comm::site_hash(desc.site))};
      std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(size));
      if (size <= check_by_messages_up_to) {
        // One message to and from every other rank: a wait that times out then names the ranks
        // whose message is missing (a dead rank), where an all-gather could name only all of them.
        std::copy(mine.begin(), mine.end(), all.begin() + check_words * rank);
        for (int q = 0; q < size; ++q)
          if (q != rank) post_recv(all.data() + check_words * q, sizeof(mine), q, check_tag);
        for (int q = 0; q < size; ++q)
          if (q != rank) post_send(mine.data(), sizeof(mine), q, check_tag);
      } else {
        MPI_Request r;
        {
          detail::comm::MpiLock lock;
          check(MPI_Iallgather(mine.data(), check_words, MPI_INT64_T, all.data(), check_words, MPI_INT64_T, comm, &r),
                "MPI_Iallgather");
        }
        stats.record_moved(desc.kind, static_cast<double>(sizeof(mine) * static_cast<std::size_t>(size - 1)));
        add_request(r, any_peer);
      }
      wait();
      bool same = true;  // word 5, the sequence number, is for the reader of a dump: not compared
      for (int q = 0; q < size; ++q)
        for (int w = 0; w < check_words; ++w) same = same && (w == 5 || all[check_words * q + w] == mine[w]);
      if (same) return;
      // Every rank saw the same table: all of them exchange the sites' texts, then throw.
      const std::vector<std::string> sites = exchange_sites(desc.site);
      std::string message = "polyshard: mismatched collectives (MPI) seen by rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + ":";
      for (int q = 0; q < size; ++q) {
        const std::int64_t* d = all.data() + check_words * q;
        const CallDesc theirs{static_cast<CollectiveKind>(d[0]), static_cast<DType>(d[1]),
                              static_cast<std::uint64_t>(d[2]), static_cast<int>(d[3]), static_cast<ReduceOp>(d[4]),
                              sites[static_cast<std::size_t>(q)]};
        message += std::string(q ? ";" : "") + " rank " + std::to_string(q) + " called " + detail::comm::describe(theirs);
      }
      // Nothing of the collective was sent, but the ranks' queues of calls no longer line up (one
      // rank may have issued more asynchronous calls behind this one): every later call on this
      // communicator fails at once rather than pair with the wrong call of another rank.
      mismatch = message;
      throw Error(message);
    }

    /// Every rank's call site text, by rank (after a mismatch, which every rank saw).
    std::vector<std::string> exchange_sites(const std::string& site) {
      const int length = static_cast<int>(site.size());
      std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
      MPI_Request r;
      {
        detail::comm::MpiLock lock;
        check(MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm, &r), "MPI_Iallgather");
      }
      add_request(r, any_peer);
      wait();
      int total = 0;
      for (int q = 0; q < size; ++q) {
        offsets[static_cast<std::size_t>(q)] = total;
        total += lengths[static_cast<std::size_t>(q)];
      }
      std::string texts(static_cast<std::size_t>(total), '\0');
      {
        detail::comm::MpiLock lock;
        check(MPI_Iallgatherv(site.data(), length, MPI_CHAR, texts.data(), lengths.data(), offsets.data(), MPI_CHAR, comm,
                              &r),
              "MPI_Iallgatherv");
      }
      add_request(r, any_peer);
      wait();
      std::vector<std::string> sites;
      for (int q = 0; q < size; ++q)
        sites.push_back(texts.substr(static_cast<std::size_t>(offsets[static_cast<std::size_t>(q)]),
                                     static_cast<std::size_t>(lengths[static_cast<std::size_t>(q)])));
      return sites;
    }

    template <class T>
    static CallDesc call(CollectiveKind kind, std::uint64_t count, int root = -1, ReduceOp op = ReduceOp::Sum) {
      return CallDesc{kind, dtype_v<T>, count, root, op};
    }

    /// This rank's share of a reduce-scatter, the same chunks and additions as
    /// ThreadCommunicator: every rank sends chunk q of its input to rank q, and sums the chunks
    /// it receives with its own in rank order into `out` (which may be its own chunk of `src`).
    /// Each rank sends and receives (N-1)/N of the buffer, as in a ring.
    template <class T>
    void direct_reduce_scatter(const T* src, T* out, Chunks chunks, ReduceOp op) {
      const int N = size;
      const std::uint64_t len = chunks.size(rank);
      T* incoming = recv_scratch.get_as<T>(len * static_cast<std::uint64_t>(N - 1));
      std::vector<const T*> parts(static_cast<std::size_t>(N));
      for (int q = 0, slot = 0; q < N; ++q) {
        if (q == rank) {
          parts[static_cast<std::size_t>(q)] = src + chunks.begin(rank);
          continue;
        }
        T* into = incoming + len * static_cast<std::uint64_t>(slot++);
        post_recv(into, len * sizeof(T), q, ring_tag);
        parts[static_cast<std::size_t>(q)] = into;
      }
      for (int q = 0; q < N; ++q)
        if (q != rank) post_send(src + chunks.begin(q), chunks.size(q) * sizeof(T), q, ring_tag);
      wait();
      detail::comm::sum_in_rank_order<compute_t<T>>(out, parts.data(), N, len, op == ReduceOp::Avg ? N : 1);
    }

    /// Ring all-gather over `data`, chunk r already in place on rank r.
    template <class T>
    void ring_all_gather(T* data, Chunks chunks) {
      const int N = size;
      for (int t = 0; t <= N - 2; ++t) {
        const int send_c = detail::comm::wrap(rank - t, N);
        const int recv_c = detail::comm::wrap(rank - 1 - t, N);
        post_recv(data + chunks.begin(recv_c), chunks.size(recv_c) * sizeof(T), left(), ring_tag);
        post_send(data + chunks.begin(send_c), chunks.size(send_c) * sizeof(T), right(), ring_tag);
        wait();
      }
    }

    template <class T>
    void all_reduce(std::span<T> buf, ReduceOp op) {
      enter(call<T>(CollectiveKind::AllReduce, buf.size(), -1, op));
      if (size == 1) return;
      const Chunks chunks{buf.size(), size};
      direct_reduce_scatter<T>(buf.data(), buf.data() + chunks.begin(rank), chunks, op);
      ring_all_gather<T>(buf.data(), chunks);
    }

    template <class T>
    void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op) {
      using C = compute_t<T>;
      enter(call<T>(CollectiveKind::ReduceScatter, in.size(), -1, op));
      if (size == 1) {
        detail::comm::convert<C>(out.data(), in.data(), out.size());
        return;
      }
      direct_reduce_scatter<T>(in.data(), out.data(), Chunks{in.size(), size}, op);
    }

    template <class T>
    void all_gather(std::span<const T> in, std::span<T> out) {
      enter(call<T>(CollectiveKind::AllGather, in.size()));
      if (!in.empty()) std::memcpy(out.data() + in.size() * static_cast<std::size_t>(rank), in.data(), in.size_bytes());
      if (size == 1) return;
      ring_all_gather<T>(out.data(), Chunks{out.size(), size});
    }

    template <class T>
    void broadcast(std::span<T> buf, int root) {
      enter(call<T>(CollectiveKind::Broadcast, buf.size(), root));
      if (size == 1) return;
      auto* p = reinterpret_cast<char*>(buf.data());
      std::size_t bytes = buf.size_bytes();
      do {
        const std::size_t len = std::min(bytes, detail::comm::mpi_max_message);
        MPI_Request r;
        {
          detail::comm::MpiLock lock;
          check(MPI_Ibcast(p, static_cast<int>(len), MPI_BYTE, root, comm, &r), "MPI_Ibcast");
        }
        if (rank == root) stats.record_moved(CollectiveKind::Broadcast, static_cast<double>(len));
        add_request(r, rank == root ? any_peer : root);  // a receiver waits on the root's data
        p += len;
        bytes -= len;
      } while (bytes > 0);
      wait();
    }

    /// A reduce-scatter (the additions of all_reduce), then every rank sends its reduced chunk
    /// to the root: the work is spread over the ranks instead of piling on the root.
    template <class T>
    void reduce(std::span<T> buf, int root, ReduceOp op) {
      enter(call<T>(CollectiveKind::Reduce, buf.size(), root, op));
      if (size == 1) return;
      const Chunks chunks{buf.size(), size};
      // The root's own chunk lands in place (summed in blocks, each read whole before it is
      // written); the others keep their buffers and reduce into scratch.
      T* mine = rank == root ? buf.data() + chunks.begin(rank) : out_scratch.get_as<T>(chunks.size(rank));
      direct_reduce_scatter<T>(buf.data(), mine, chunks, op);
      if (rank != root) {
        post_send(mine, chunks.size(rank) * sizeof(T), root, reduce_tag);
        wait();
        return;
      }
      // The root's input is no longer needed: receive the other chunks straight into it.
      for (int q = 0; q < size; ++q)
        if (q != root) post_recv(buf.data() + chunks.begin(q), chunks.size(q) * sizeof(T), q, reduce_tag);
      wait();
    }

    void barrier() {
      enter(CallDesc{CollectiveKind::Barrier, DType::F32, 0, -1, ReduceOp::Sum});
      if (size == 1) return;
      MPI_Request r;
      {
        detail::comm::MpiLock lock;
        check(MPI_Ibarrier(comm, &r), "MPI_Ibarrier");
      }
      add_request(r, any_peer);
      wait();
    }
  };

  explicit MpiCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

  template <class F>
  void run(CollectiveKind kind, std::size_t buffer_bytes, F&& body) {
    impl_->stats.record(kind, ring_bytes_sent(kind, buffer_bytes, size()));
    impl_->worker.run(std::forward<F>(body));
  }
  template <class F>
  CommHandle submit(CollectiveKind kind, std::size_t buffer_bytes, F&& body) {
    impl_->stats.record(kind, ring_bytes_sent(kind, buffer_bytes, size()));
    // Below MPI_THREAD_SERIALIZED only this thread may call MPI: run now, hand back a done handle.
    if (detail::comm::MpiState::get().thread_level.load() < MPI_THREAD_SERIALIZED) {
      impl_->worker.run(std::forward<F>(body));
      return CommHandle();
    }
    return impl_->worker.submit(std::forward<F>(body));
  }

  std::unique_ptr<Impl> impl_;
};

static_assert(Communicator<MpiCommunicator>);

}  // namespace polyshard
