// NCCL backend: one GPU per rank, collectives enqueued on a CUDA stream, communicators created
// non-blocking so that a wait can time out. Needs <nccl.h>, CUDA::cudart and libnccl.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
#include "polyshard/comm/detail/ring.hpp"
#include "polyshard/comm/reduce_op.hpp"
#include "polyshard/core/cuda/current_stream.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/emulation/nccl_traffic.hpp"

namespace polyshard {

namespace detail::comm {

template <class T>
constexpr ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, half>) return ncclFloat16;  // Eigen::half has __half's layout
  else return ncclBfloat16;
}
inline ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Avg ? ncclAvg : ncclSum; }

/// The state a communicator and its in-flight handles share (a handle may outlive a move).
struct NcclState {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  float* barrier_word = nullptr;  // device scratch: a barrier is an all-reduce of one float
  bool broken = false;
  bool explaining = false;  // fail() is looking for a mismatch behind the failure
  std::string failure;      // why it broke
  CommOptions options;
  CommStats stats;
  std::atomic<std::uint64_t> host_waits{0};  // handles wait()ed on the host (NcclCommunicator::host_waits)

  // The call check (CommOptions::check_calls): before each collective, every rank's description
  // of it is all-gathered on the same stream into a table in pinned host memory, compared when
  // the collective is waited for. A record: kind, element type, count, root, operator, sequence
  // number and the call site's hash (int64 each), then the site's first check_site_bytes bytes.
  static constexpr std::size_t check_words = 7;
  static constexpr std::size_t check_seq_word = 5;  // the sequence number, which ranks may differ in
  static constexpr std::size_t check_site_bytes = 256;
  static constexpr std::size_t check_bytes = check_words * sizeof(std::int64_t) + check_site_bytes;
  /// The sequence word of a record that has not arrived yet.
  static constexpr std::int64_t not_arrived = std::numeric_limits<std::int64_t>::min();
  std::uint64_t seq = 0;  // calls checked so far
  std::mutex tables_mutex;
  std::vector<std::byte*> free_tables;                         // size x check_bytes each
  std::vector<std::pair<cudaEvent_t, std::byte*>> retired;     // tables a copy may still write
  std::vector<std::byte*> abandoned;  // tables of checks that failed to start: freed at the end
  std::vector<std::pair<cudaEvent_t, std::byte*>> unchecked;  // started, not compared yet, in issue order

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  ~NcclState() {
    for (auto& [event, table] : retired) {
      cudaEventSynchronize(event);
      cudaEventDestroy(event);
      free_tables.push_back(table);
    }
    for (std::byte* t : free_tables) cudaFreeHost(t);
    for (std::byte* t : abandoned) cudaFreeHost(t);  // synchronizes with any copy still running
  }
  /// A pinned table of size x check_bytes (reused).
  std::byte* take_table(const CallDesc& d) {
    {
      std::lock_guard lock(tables_mutex);
      for (std::size_t i = 0; i < retired.size();)
        if (cudaEventQuery(retired[i].first) == cudaSuccess) {
          cudaEventDestroy(retired[i].first);
          free_tables.push_back(retired[i].second);
          retired.erase(retired.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      if (!free_tables.empty()) {
        std::byte* t = free_tables.back();
        free_tables.pop_back();
        return t;
      }
    }
    void* t = nullptr;  // a failure throws through fail(), which takes tables_mutex
    check_cuda(cudaHostAlloc(&t, check_bytes * static_cast<std::size_t>(size), cudaHostAllocDefault), d,
               "cudaHostAlloc");
    return static_cast<std::byte*>(t);
  }
  /// Gives a table back once `event` (after the copy into it) has fired; takes `event` over.
  void give_back_table(std::byte* table, cudaEvent_t event) {
    std::lock_guard lock(tables_mutex);
    std::erase_if(unchecked, [&](const auto& c) { return c.second == table; });
    if (cudaEventQuery(event) == cudaSuccess) {
      cudaEventDestroy(event);
      free_tables.push_back(table);
    } else {
      retired.emplace_back(event, table);
    }
  }

  /// Whether every rank's record in `table` arrived: the copy of the gathered records overwrote
  /// every mark start_call_check left in the others' sequence words.
  bool records_arrived(const std::byte* table) const {
    for (int q = 0; q < size; ++q) {
      std::int64_t seq = 0;
      std::memcpy(&seq, record(table, q) + check_seq_word * sizeof(std::int64_t), sizeof(seq));
      if (seq == not_arrived) return false;
    }
    return true;
  }
  /// Every rank's call, if the records in `table` differ (the sequence number aside).
  std::optional<std::string> mismatch(const std::byte* table) const {
    const auto words = [&](int q) {
      std::array<std::int64_t, check_words> w;
      std::memcpy(w.data(), record(table, q), sizeof(w));
      return w;
    };
    const auto mine = words(rank);
    bool same = true;
    for (int q = 0; q < size; ++q) {
      const auto theirs = words(q);
      for (std::size_t w = 0; w < check_words; ++w) same = same && (w == check_seq_word || theirs[w] == mine[w]);
    }
    if (same) return std::nullopt;
    std::string message = "polyshard: mismatched collectives (NCCL) seen by rank " + std::to_string(rank) + " of " +
                          std::to_string(size) + ":";
    for (int q = 0; q < size; ++q) {
      const auto d = words(q);
      const char* text = reinterpret_cast<const char*>(record(table, q) + sizeof(std::int64_t) * check_words);
      std::string site(text, ::strnlen(text, check_site_bytes));
      if (site.size() == check_site_bytes) site += "...";  // the first check_site_bytes only
      const CallDesc theirs{static_cast<CollectiveKind>(d[0]), static_cast<DType>(d[1]),
                            static_cast<std::uint64_t>(d[2]),    static_cast<int>(d[3]),
                            static_cast<ReduceOp>(d[4]),         site};
      message += std::string(q ? ";" : "") + " rank " + std::to_string(q) + " called " + describe(theirs);
    }
    return message;
  }
  /// The first mismatch among the call checks of collectives in flight, waiting up to 200 ms in
  /// all for records still being copied.
  std::optional<std::string> mismatch_in_flight() {
    std::lock_guard lock(tables_mutex);  // a handle that gives its table back waits
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    for (const auto& [event, table] : unchecked) {
      while (cudaEventQuery(event) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (!records_arrived(table)) continue;
      if (auto m = mismatch(table)) return m;
    }
    return std::nullopt;
  }
  static std::byte* record(std::byte* table, int q) { return table + check_bytes * static_cast<std::size_t>(q); }
  static const std::byte* record(const std::byte* table, int q) {
    return table + check_bytes * static_cast<std::size_t>(q);
  }

  // Measured traffic, where the emulated NCCL counts it (emulation/nccl_traffic.hpp; a real
  // NCCL's is invisible): the collective each of this rank's NCCL calls was made for, by its
  // number on the communicator, until the emulation reports its bytes. The call check's
  // all-gather counts under the collective it checks, as under MPI.
  std::mutex traffic_mutex;
  std::uint64_t nccl_calls = 0;
  std::map<std::uint64_t, CollectiveKind> call_kinds;
  static bool traffic_visible() { return &emulation::take_nccl_traffic != nullptr; }
  /// The next NCCL collective this rank issues on the communicator is for `kind`.
  void note_nccl_call(CollectiveKind kind) {
    if (!traffic_visible()) return;
    std::lock_guard lock(traffic_mutex);
    call_kinds.emplace(nccl_calls++, kind);
  }
  /// Moves what the emulation counted for finished collectives into the byte counters.
  void collect_traffic() {
    if (!traffic_visible() || !comm) return;
    std::vector<emulation::NcclTraffic> done;
    if (emulation::take_nccl_traffic(comm, done) != ncclSuccess) return;
    std::lock_guard lock(traffic_mutex);
    for (const emulation::NcclTraffic& t : done) {
      const auto at = call_kinds.find(t.call);
      if (at == call_kinds.end()) continue;
      stats.record_moved(at->second, static_cast<double>(t.bytes));
      call_kinds.erase(at);
    }
  }

  std::string where(const CallDesc& d) const {
    return "polyshard: " + describe(d) + " on rank " + std::to_string(rank) + " of " + std::to_string(size) +
           " (NCCL, device " + std::to_string(device) + ")";
  }
  std::string others() const {
    std::vector<int> ranks;
    for (int q = 0; q < size; ++q)
      if (q != rank) ranks.push_back(q);
    return ranks.empty() ? std::string("no other rank") : rank_list(ranks);
  }

  /// Aborts the NCCL communicator (so that kernels stuck waiting for peers exit) and throws.
  /// A rank that sees a mismatch first aborts, which fails the other ranks' calls wherever they
  /// are (a wait, the next enqueue, the mismatched collective itself): so that each of them
  /// names the mismatch rather than the abort, a call check of a collective in flight whose
  /// records arrived and disagree replaces `message`.
  [[noreturn]] void fail(const std::string& message) {
    if (comm && !broken) ncclCommAbort(comm);
    broken = true;
    comm = nullptr;
    failure = message;
    if (!explaining) {
      explaining = true;
      if (auto mismatch = mismatch_in_flight()) failure = *mismatch;
    }
    throw Error(failure);
  }
  void check_nccl(ncclResult_t rc, const CallDesc& d, const char* call) {
    if (rc != ncclSuccess && rc != ncclInProgress)
      fail(where(d) + ": " + call + " failed: " + ncclGetErrorString(rc) + " (" + ncclGetLastError(comm) + ")");
  }
  void check_cuda(cudaError_t rc, const CallDesc& d, const char* call) {
    if (rc != cudaSuccess) fail(where(d) + ": " + call + " failed: " + cudaGetErrorString(rc));
  }

  /// A non-blocking communicator answers ncclInProgress until an operation is issued (or the
  /// communicator is ready); polls it until then, or the deadline.
  void settle(const CallDesc& d, std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
      check_nccl(rc, d, "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) check_nccl(state, d, "NCCL");
      if (std::chrono::steady_clock::now() >= deadline)
        fail(where(d) + " timed out after " + seconds_text(options.timeout) + " waiting for " + others());
      std::this_thread::yield();
    }
  }
  /// settle() without failing: polls until the communicator is no longer in progress or the
  /// deadline passed, and leaves any error for a later settle() to report.
  void settle_quietly(std::chrono::steady_clock::time_point deadline) {
    ncclResult_t state = ncclInProgress;
    while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }

  /// Polls `event` (recorded after the collective) until it fired, NCCL reported an error, or
  /// the deadline passed.
  void wait_event(cudaEvent_t event, const CallDesc& d, std::chrono::steady_clock::time_point deadline) {
    for (long spins = 0;; ++spins) {
      const cudaError_t rc = cudaEventQuery(event);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) check_cuda(rc, d, "cudaEventQuery");
      ncclResult_t state = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm, &state), d, "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) check_nccl(state, d, "NCCL");
      if (std::chrono::steady_clock::now() >= deadline)
        fail(where(d) + " timed out after " + seconds_text(options.timeout) + " waiting for " + others());
      if (spins > 1024) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
};

/// Every rank's description of one collective, all-gathered ahead of it on its stream: `table`
/// holds the records once `event` fired.
struct NcclCallCheck {
  std::byte* table = nullptr;
  cudaEvent_t event = nullptr;
};

/// Rank `rank`'s call-check record of `d`, call number `seq`, into `out` (check_bytes).
inline void write_check_record(std::byte* out, const CallDesc& d, std::uint64_t seq) {
  const std::array<std::int64_t, NcclState::check_words> words{
      static_cast<std::int64_t>(d.kind), static_cast<std::int64_t>(d.dtype), static_cast<std::int64_t>(d.count),
      d.root, static_cast<std::int64_t>(d.op), static_cast<std::int64_t>(seq),
      static_cast<std::int64_t>(site_hash(d.site))};
  std::memcpy(out, words.data(), sizeof(words));
  std::byte* text = out + sizeof(words);
  std::memset(text, 0, NcclState::check_site_bytes);
  std::memcpy(text, d.site.data(), std::min(d.site.size(), NcclState::check_site_bytes));
}

/// A collective on a stream: done when the event recorded after it fires. With the call check,
/// its table is compared first: a mismatch fails as soon as the descriptions arrived, rather
/// than when the mismatched collective times out.
class NcclPending final : public PendingOp {
 public:
  NcclPending(std::shared_ptr<NcclState> state, cudaEvent_t event, CallDesc desc,
              std::chrono::steady_clock::time_point deadline, NcclCallCheck check = {})
      : state_(std::move(state)), event_(event), desc_(desc), deadline_(deadline), check_(check) {}
  ~NcclPending() override {
    cudaEventDestroy(event_);
    if (check_.table) state_->give_back_table(check_.table, check_.event);
  }
  void wait() override {
    if (done_) return;
    if (!counted_) state_->host_waits.fetch_add(1, std::memory_order_relaxed);
    counted_ = true;
    if (state_->broken)
      throw Error(state_->where(desc_) + " cannot complete: the communicator was aborted after an earlier failure (" +
                  state_->failure + ")");
    if (check_.table && !compared_) {
      state_->wait_event(check_.event, desc_, deadline_);
      compared_ = true;
      {
        std::lock_guard lock(state_->tables_mutex);
        std::erase_if(state_->unchecked, [&](const auto& c) { return c.second == check_.table; });
      }
      if (auto mismatch = state_->mismatch(check_.table)) {
        state_->explaining = true;  // this is the explanation
        state_->fail(*mismatch);
      }
    }
    state_->wait_event(event_, desc_, deadline_);  // throws on failure: a later wait() throws again
    done_ = true;
    state_->collect_traffic();
  }
  bool ready() override { return done_ || cudaEventQuery(event_) != cudaErrorNotReady; }
  bool wait_on_device() override {
    if (done_) return true;
    if (state_->broken) return false;  // wait() reports the failure
    state_->check_cuda(cudaStreamWaitEvent(cuda::current_stream(), event_, 0), desc_, "cudaStreamWaitEvent");
    return true;
  }

 private:
  std::shared_ptr<NcclState> state_;
  cudaEvent_t event_;
  CallDesc desc_;
  std::chrono::steady_clock::time_point deadline_;
  NcclCallCheck check_;
  bool compared_ = false;
  bool done_ = false;
  bool counted_ = false;
};

}  // namespace detail::comm

/// One rank of an NCCL communicator: one GPU per rank, buffers in device memory.
///
/// Collectives are enqueued on a CUDA stream: the communicator's own (created on its device) unless
/// set_stream() names the caller's, or an `_async` call passes one. A collective starts after the
/// work the calling thread enqueued before it on its current stream (cuda::current_stream(), where
/// Tensor<T, Cuda> work goes): the buffers it reads are complete. The blocking forms return once
/// the collective finished on the device; the `_async` forms return a handle whose wait() does,
/// so the GPU overlaps communication with compute on other streams. The NCCL communicator is
/// created non-blocking: every wait polls, and a collective that outlives timeout() aborts the
/// communicator (ncclCommAbort) and throws polyshard::Error naming the collective, the rank and
/// the ranks of the communicator it waited for. Afterwards the object is broken: create a new one.
///
/// Half and bfloat16 reduce as NCCL reduces them (each hop rounds to the element type); reduce
/// in float where that matters. Byte counters follow ring_bytes_sent() like every backend.
///
/// Unless CommOptions::check_calls is off, every collective is preceded on its stream by an
/// all-gather of each rank's description of it (312 bytes a rank: kind, element type, count,
/// root, operator, the call site's hash and its first 256 characters), compared when the
/// collective is waited for: ranks that issue different collectives, or the same one with
/// different sizes or from different call sites, fail on every rank with "mismatched
/// collectives (NCCL)" naming each rank's call, as soon as the descriptions arrived (the
/// mismatched collective itself is aborted with the communicator).
class NcclCommunicator {
 public:
  /// Its buffers are device memory (an engine on a device requires this).
  static constexpr bool device_buffers = true;

  /// Number of CUDA devices this process sees (0 when there is no GPU or no driver).
  static int device_count() noexcept {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return 0;
    }
    return count;
  }

  /// Joins rank `rank` of `size` of the NCCL communicator identified by `id` (from
  /// ncclGetUniqueId on one rank, shared with the others), on CUDA device `device`.
  NcclCommunicator(int rank, int size, const ncclUniqueId& id, int device, CommOptions options = {})
      : state_(std::make_shared<detail::comm::NcclState>()) {
    auto& s = *state_;
    s.rank = rank;
    s.size = size;
    s.device = device;
    s.options = options;
    const detail::comm::CallDesc init{CollectiveKind::Split, DType::F32, 0, -1, ReduceOp::Sum};
    int count = 0;
    const cudaError_t found = cudaGetDeviceCount(&count);
    if (found != cudaSuccess) cudaGetLastError();
    POLYSHARD_CHECK(found == cudaSuccess && device >= 0 && device < count, "polyshard: NcclCommunicator rank ", rank,
                    " needs CUDA device ", device, " but ",
                    found == cudaSuccess ? std::to_string(count) + " device(s) are visible"
                                         : std::string("CUDA reports: ") + cudaGetErrorString(found),
                    " (no GPU: use ThreadCommunicator or MpiCommunicator)");
    s.check_cuda(cudaSetDevice(device), init, "cudaSetDevice");
    s.check_cuda(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), init, "cudaStreamCreate");
    s.own_stream = true;
    s.check_cuda(cudaMalloc(reinterpret_cast<void**>(&s.barrier_word), sizeof(float)), init, "cudaMalloc");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId copy = id;
    s.check_nccl(ncclCommInitRankConfig(&s.comm, size, copy, rank, &config), init, "ncclCommInitRankConfig");
    s.settle(init, std::chrono::steady_clock::now() + s.options.timeout);
  }

  /// Creates the NCCL communicator over the ranks of `boot` (an MpiCommunicator, or a
  /// ThreadCommunicator whose ranks each own a GPU): rank 0 makes the unique id, `boot`
  /// broadcasts it, and rank r of `boot` becomes rank r here on `device`.
  template <Communicator Boot>
  static NcclCommunicator bootstrap(Boot& boot, int device, CommOptions options = {}) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (boot.rank() == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&id);
      POLYSHARD_CHECK(rc == ncclSuccess, "polyshard: ncclGetUniqueId failed: ", ncclGetErrorString(rc));
    }
    // The id is opaque bytes; broadcast copies floats bit for bit (no arithmetic touches them).
    std::array<float, sizeof(ncclUniqueId) / sizeof(float)> words;
    std::memcpy(words.data(), &id, sizeof(id));
    boot.broadcast(std::span<float>(words), 0);
    std::memcpy(&id, words.data(), sizeof(id));
    return NcclCommunicator(boot.rank(), boot.size(), id, device, options);
  }

  NcclCommunicator(NcclCommunicator&&) noexcept = default;
  NcclCommunicator& operator=(NcclCommunicator&&) noexcept = default;
  ~NcclCommunicator() {
    if (!state_) return;
    auto& s = *state_;
    if (s.comm) {
      cudaSetDevice(s.device);
      // Finalize flushes outstanding work (non-blocking: poll it, bounded), then destroy; a
      // communicator that does not finish in time is aborted instead of hanging the destructor.
      ncclResult_t state = ncclCommFinalize(s.comm);
      const auto deadline = std::chrono::steady_clock::now() + s.options.timeout;
      while ((state == ncclSuccess || state == ncclInProgress) && std::chrono::steady_clock::now() < deadline) {
        if (ncclCommGetAsyncError(s.comm, &state) != ncclSuccess || state != ncclInProgress) break;
        std::this_thread::yield();
      }
      if (state == ncclSuccess) ncclCommDestroy(s.comm);
      else ncclCommAbort(s.comm);
      s.comm = nullptr;
    }
    if (s.barrier_word) cudaFree(s.barrier_word);
    if (s.own_stream && s.stream) cudaStreamDestroy(s.stream);
  }

  int rank() const { return state_->rank; }
  int size() const { return state_->size; }
  int device() const { return state_->device; }
  ncclComm_t native() const { return state_->comm; }

  /// The stream the blocking forms, and the `_async` forms without a stream, enqueue on.
  /// The communicator does not own a stream set here.
  void set_stream(cudaStream_t stream) {
    auto& s = *state_;
    if (s.own_stream && s.stream) cudaStreamDestroy(s.stream);
    s.stream = stream;
    s.own_stream = false;
  }
  cudaStream_t stream() const { return state_->stream; }

  /// Sums (or averages) the device buffer `buf` over all ranks, in place.
  template <FloatElement T>
  void all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::Sum) { all_reduce_async(buf, op).wait(); }
  template <FloatElement T>
  CommHandle all_reduce_async(std::span<T> buf, ReduceOp op = ReduceOp::Sum, cudaStream_t stream = nullptr) {
    return launch(CollectiveKind::AllReduce, buf.size_bytes(), call<T>(CollectiveKind::AllReduce, buf.size(), -1, op),
                  stream, [&](cudaStream_t st) {
                    return ncclAllReduce(buf.data(), buf.data(), buf.size(), detail::comm::nccl_type<T>(),
                                         detail::comm::nccl_op(op), state_->comm, st);
                  });
  }

  /// Reduces `in` (size() x out.size() elements) over all ranks; rank r receives slice r.
  template <FloatElement T>
  void reduce_scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async<T>(in, out, op).wait();
  }
  template <FloatElement T>
  CommHandle reduce_scatter_async(std::type_identity_t<std::span<const T>> in, std::span<T> out,
                                  ReduceOp op = ReduceOp::Sum, cudaStream_t stream = nullptr) {
    detail::comm::check_multiple(CollectiveKind::ReduceScatter, in.size(), out.size(), size(), rank(), "the input",
                                 "the output");
    return launch(CollectiveKind::ReduceScatter, in.size_bytes(),
                  call<T>(CollectiveKind::ReduceScatter, in.size(), -1, op), stream, [&](cudaStream_t st) {
                    return ncclReduceScatter(in.data(), out.data(), out.size(), detail::comm::nccl_type<T>(),
                                             detail::comm::nccl_op(op), state_->comm, st);
                  });
  }

  /// Concatenates every rank's `in` into `out` (size() x in.size() elements), rank order.
  template <FloatElement T>
  void all_gather(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    all_gather_async<T>(in, out).wait();
  }
  template <FloatElement T>
  CommHandle all_gather_async(std::type_identity_t<std::span<const T>> in, std::span<T> out,
                              cudaStream_t stream = nullptr) {
    detail::comm::check_multiple(CollectiveKind::AllGather, out.size(), in.size(), size(), rank(), "the output",
                                 "the input");
    return launch(CollectiveKind::AllGather, out.size_bytes(), call<T>(CollectiveKind::AllGather, in.size()), stream,
                  [&](cudaStream_t st) {
                    return ncclAllGather(in.data(), out.data(), in.size(), detail::comm::nccl_type<T>(), state_->comm,
                                         st);
                  });
  }

  /// Copies `root`'s `buf` into every rank's `buf`.
  template <FloatElement T>
  void broadcast(std::span<T> buf, int root) { broadcast_async(buf, root).wait(); }
  template <FloatElement T>
  CommHandle broadcast_async(std::span<T> buf, int root, cudaStream_t stream = nullptr) {
    detail::comm::check_root(CollectiveKind::Broadcast, root, size(), rank());
    return launch(CollectiveKind::Broadcast, buf.size_bytes(), call<T>(CollectiveKind::Broadcast, buf.size(), root),
                  stream, [&](cudaStream_t st) {
                    return ncclBroadcast(buf.data(), buf.data(), buf.size(), detail::comm::nccl_type<T>(), root,
                                         state_->comm, st);
                  });
  }

  /// Sums (or averages) every rank's `buf` into `root`'s `buf`; the others keep theirs.
  template <FloatElement T>
  void reduce(std::span<T> buf, int root, ReduceOp op = ReduceOp::Sum) { reduce_async(buf, root, op).wait(); }
  template <FloatElement T>
  CommHandle reduce_async(std::span<T> buf, int root, ReduceOp op = ReduceOp::Sum, cudaStream_t stream = nullptr) {
    detail::comm::check_root(CollectiveKind::Reduce, root, size(), rank());
    return launch(CollectiveKind::Reduce, buf.size_bytes(), call<T>(CollectiveKind::Reduce, buf.size(), root, op),
                  stream, [&](cudaStream_t st) {
                    return ncclReduce(buf.data(), buf.data(), buf.size(), detail::comm::nccl_type<T>(),
                                      detail::comm::nccl_op(op), root, state_->comm, st);
                  });
  }

  /// Returns once every rank reached it (NCCL has no barrier: an all-reduce of one float).
  void barrier() { barrier_async().wait(); }
  CommHandle barrier_async(cudaStream_t stream = nullptr) {
    float* word = state_->barrier_word;
    return launch(CollectiveKind::Barrier, 0, detail::comm::CallDesc{CollectiveKind::Barrier, DType::F32, 0, -1, ReduceOp::Sum},
                  stream, [&](cudaStream_t st) {
                    return ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, state_->comm, st);
                  });
  }

  /// ncclCommSplit: ranks passing the same `color` (>= 0) form a new communicator on the same
  /// device, ranked by (`key`, rank here). Collective.
  NcclCommunicator split(int color, int key) {
    POLYSHARD_CHECK(color >= 0, "polyshard: split on rank ", rank(), ": colour must be >= 0, got ", color);
    auto& s = *state_;
    const detail::comm::CallDesc desc{CollectiveKind::Split, DType::F32, 0, -1, ReduceOp::Sum};
    check_usable(desc);
    s.stats.record(CollectiveKind::Split, 0);
    s.check_cuda(cudaSetDevice(s.device), desc, "cudaSetDevice");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = nullptr;
    s.check_nccl(ncclCommSplit(s.comm, color, key, &sub, &config), desc, "ncclCommSplit");
    const auto deadline = std::chrono::steady_clock::now() + s.options.timeout;
    s.settle(desc, deadline);
    NcclCommunicator result;
    auto& r = *result.state_;
    r.comm = sub;
    r.device = s.device;
    r.options = s.options;
    // The new communicator may still be initializing: wait for it like for any NCCL call.
    r.rank = 0;
    r.size = 1;
    r.settle(desc, deadline);
    ncclCommUserRank(sub, &r.rank);
    ncclCommCount(sub, &r.size);
    r.check_cuda(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), desc, "cudaStreamCreate");
    r.own_stream = true;
    r.check_cuda(cudaMalloc(reinterpret_cast<void**>(&r.barrier_word), sizeof(float)), desc, "cudaMalloc");
    return result;
  }

  /// The byte counters. Measured bytes (bytes_moved) are counted only on the emulated NCCL, for
  /// the collectives waited for so far; on a real NCCL they stay 0 and bytes_sent, the ring
  /// formula, is the prediction. Both forms collect the traffic first, so that a communicator
  /// read through a const path (an engine's hybrid groups) is as current as any other.
  CommStats& stats() {
    state_->collect_traffic();
    return state_->stats;
  }
  const CommStats& stats() const {
    state_->collect_traffic();
    return state_->stats;
  }
  /// Collectives whose handle this rank's host has waited for, blocking or not (the blocking
  /// forms count one each): what a step costs the host in synchronisations with the GPU.
  std::uint64_t host_waits() const { return state_->host_waits.load(std::memory_order_relaxed); }

  void set_timeout(std::chrono::milliseconds timeout) { state_->options.timeout = timeout; }
  std::chrono::milliseconds timeout() const { return state_->options.timeout; }

 private:
  NcclCommunicator() : state_(std::make_shared<detail::comm::NcclState>()) {}

  template <class T>
  static detail::comm::CallDesc call(CollectiveKind kind, std::uint64_t count, int root = -1,
                                     ReduceOp op = ReduceOp::Sum) {
    return detail::comm::CallDesc{kind, dtype_v<T>, count, root, op};
  }

  void check_usable(const detail::comm::CallDesc& desc) const {
    POLYSHARD_CHECK(state_ && !state_->broken && state_->comm, state_->where(desc),
                    " cannot run: the communicator was aborted after an earlier failure");
  }

  /// Enqueues one collective on `stream` (or the communicator's), records an event after it, and
  /// returns a handle polling that event against the deadline.
  template <class Enqueue>
  CommHandle launch(CollectiveKind kind, std::size_t buffer_bytes, const detail::comm::CallDesc& desc,
                    cudaStream_t stream, Enqueue&& enqueue) {
    check_usable(desc);
    auto& s = *state_;
    s.stats.record(kind, ring_bytes_sent(kind, buffer_bytes, s.size));
    const auto deadline = std::chrono::steady_clock::now() + s.options.timeout;
    cudaStream_t st = stream ? stream : s.stream;
    s.check_cuda(cudaSetDevice(s.device), desc, "cudaSetDevice");
    order_after_current_stream(st, desc);
    const detail::comm::NcclCallCheck check =
        s.options.check_calls && s.size > 1 ? start_call_check(desc, st, deadline) : detail::comm::NcclCallCheck{};
    const auto give_back_check = [&] {
      if (check.table) s.give_back_table(check.table, check.event);
    };
    try {
      s.note_nccl_call(kind);
      s.check_nccl(enqueue(st), desc, collective_name(kind).data());
      s.settle(desc, deadline);
    } catch (...) {
      give_back_check();
      throw;
    }
    cudaEvent_t event = nullptr;
    const cudaError_t created = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    const cudaError_t recorded = created == cudaSuccess ? cudaEventRecord(event, st) : created;
    if (recorded != cudaSuccess) {
      if (created == cudaSuccess) cudaEventDestroy(event);
      give_back_check();
      s.check_cuda(recorded, desc, created == cudaSuccess ? "cudaEventRecord" : "cudaEventCreate");
    }
    return CommHandle(std::make_shared<detail::comm::NcclPending>(state_, event, desc, deadline, check));
  }

  /// Enqueues the call check of `desc` on `st`: this rank's record copied up, all-gathered,
  /// every record copied down into a pinned table, and an event after it.
  detail::comm::NcclCallCheck start_call_check(const detail::comm::CallDesc& desc, cudaStream_t st,
                                               std::chrono::steady_clock::time_point deadline) {
    using detail::comm::NcclState;
    auto& s = *state_;
    const std::size_t n = static_cast<std::size_t>(s.size);
    detail::comm::NcclCallCheck check{s.take_table(desc), nullptr};
    struct Abandon {  // on failure a copy may still write the table: it is freed with the state
      NcclState& s;
      detail::comm::NcclCallCheck& check;
      bool kept = false;
      ~Abandon() {
        if (kept) return;
        std::lock_guard lock(s.tables_mutex);
        std::erase_if(s.unchecked, [&](const auto& c) { return c.second == check.table; });
        if (check.event) cudaEventDestroy(check.event);
        s.abandoned.push_back(check.table);
      }
    } abandon{s, check};
    std::byte* mine = NcclState::record(check.table, s.rank);
    detail::comm::write_check_record(mine, desc, ++s.seq);
    for (int q = 0; q < s.size; ++q)  // marks the records still to come
      if (q != s.rank)
        std::memcpy(NcclState::record(check.table, q) + NcclState::check_seq_word * sizeof(std::int64_t),
                    &NcclState::not_arrived, sizeof(std::int64_t));
    std::byte* device = nullptr;  // every record, then this rank's own (stream-ordered memory)
    s.check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&device), NcclState::check_bytes * (n + 1), st), desc,
                 "cudaMallocAsync");
    std::byte* up = device + NcclState::check_bytes * n;
    cudaError_t rc = cudaMemcpyAsync(up, mine, NcclState::check_bytes, cudaMemcpyHostToDevice, st);
    ncclResult_t gathered = ncclSuccess;
    if (rc == cudaSuccess) {
      s.note_nccl_call(desc.kind);
      gathered = ncclAllGather(up, device, NcclState::check_bytes, ncclUint8, s.comm, st);
    }
    // Settled before anything else goes on the stream: a non-blocking communicator that answers
    // ncclInProgress may not have put the gather there yet, and the copy would read the records
    // before the gather wrote them (and the gather write freed memory). Quietly: should another
    // rank abort meanwhile, the table still goes in flight below, and the settle() that follows
    // reports the failure with the mismatch the table may explain.
    if (gathered == ncclInProgress) s.settle_quietly(deadline);
    const bool enqueued = gathered == ncclSuccess || gathered == ncclInProgress;
    if (rc == cudaSuccess && enqueued)
      rc = cudaMemcpyAsync(check.table, device, NcclState::check_bytes * n, cudaMemcpyDeviceToHost, st);
    const cudaError_t freed = cudaFreeAsync(device, st);
    s.check_cuda(rc, desc, "cudaMemcpyAsync (the call check)");
    s.check_nccl(gathered, desc, "ncclAllGather (the call check)");
    s.check_cuda(freed, desc, "cudaFreeAsync");
    s.check_cuda(cudaEventCreateWithFlags(&check.event, cudaEventDisableTiming), desc, "cudaEventCreate");
    s.check_cuda(cudaEventRecord(check.event, st), desc, "cudaEventRecord");
    {
      // In flight from here: a rank that compares first may abort the communicator while this
      // one still settles, and fail() then finds the mismatch in this table.
      std::lock_guard lock(s.tables_mutex);
      s.unchecked.emplace_back(check.event, check.table);
    }
    s.settle(desc, deadline);
    abandon.kept = true;
    return check;
  }

  /// Makes `st` wait for the work enqueued so far on the calling thread's current stream.
  void order_after_current_stream(cudaStream_t st, const detail::comm::CallDesc& desc) {
    const cudaStream_t producer = cuda::current_stream();
    if (producer == st) return;
    auto& s = *state_;
    cudaEvent_t ready = nullptr;
    s.check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), desc, "cudaEventCreate");
    const cudaError_t recorded = cudaEventRecord(ready, producer);
    const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(st, ready, 0) : recorded;
    cudaEventDestroy(ready);  // released once the wait is satisfied
    s.check_cuda(waited, desc, recorded == cudaSuccess ? "cudaStreamWaitEvent" : "cudaEventRecord");
  }

  std::shared_ptr<detail::comm::NcclState> state_;
};

static_assert(Communicator<NcclCommunicator>);

}  // namespace polyshard
