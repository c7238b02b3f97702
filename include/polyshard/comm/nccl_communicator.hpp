// NCCL backend: one GPU per rank, collectives enqueued on a CUDA stream, communicators created
// non-blocking so that a wait can time out. Needs <nccl.h>, CUDA::cudart and libnccl.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "polyshard/comm/comm_handle.hpp"
#include "polyshard/comm/comm_options.hpp"
#include "polyshard/comm/comm_stats.hpp"
#include "polyshard/comm/communicator.hpp"
#include "polyshard/comm/detail/ring.hpp"
#include "polyshard/comm/reduce_op.hpp"
#include "polyshard/core/cuda/current_stream.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"

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
  CommOptions options;
  CommStats stats;

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
  [[noreturn]] void fail(const std::string& message) {
    if (comm && !broken) ncclCommAbort(comm);
    broken = true;
    comm = nullptr;
    throw Error(message);
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

/// A collective on a stream: done when the event recorded after it fires.
class NcclPending final : public PendingOp {
 public:
  NcclPending(std::shared_ptr<NcclState> state, cudaEvent_t event, CallDesc desc,
              std::chrono::steady_clock::time_point deadline)
      : state_(std::move(state)), event_(event), desc_(desc), deadline_(deadline) {}
  ~NcclPending() override { cudaEventDestroy(event_); }
  void wait() override {
    if (!done_) {
      state_->wait_event(event_, desc_, deadline_);  // throws on failure: a later wait() throws again
      done_ = true;
    }
  }
  bool ready() override { return done_ || cudaEventQuery(event_) != cudaErrorNotReady; }

 private:
  std::shared_ptr<NcclState> state_;
  cudaEvent_t event_;
  CallDesc desc_;
  std::chrono::steady_clock::time_point deadline_;
  bool done_ = false;
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

  CommStats& stats() { return state_->stats; }
  const CommStats& stats() const { return state_->stats; }

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
    s.check_nccl(enqueue(st), desc, collective_name(kind).data());
    s.settle(desc, deadline);
    cudaEvent_t event = nullptr;
    s.check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), desc, "cudaEventCreate");
    const cudaError_t recorded = cudaEventRecord(event, st);
    if (recorded != cudaSuccess) {
      cudaEventDestroy(event);
      s.check_cuda(recorded, desc, "cudaEventRecord");
    }
    return CommHandle(std::make_shared<detail::comm::NcclPending>(state_, event, desc, deadline));
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
