// The emulated NCCL: the ranks of a communicator are threads of this process, each on its own
// emulated device; a collective is work on the rank's stream that meets the other ranks' at a
// rendezvous, where one of them computes every rank's result in a fixed rank order.
//
// Written from the NCCL documentation's description of each call (nccl.h, the user guide's
// collective operations and communicator sections).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "polyshard/core/counter_rng.hpp"
#include "polyshard/emulation/initcheck.hpp"
#include "polyshard/emulation/nccl_traffic.hpp"
#include "polyshard/emulation/runtime.hpp"

namespace emu = polyshard::emulation;

namespace {

// ---------------------------------------------------------------------------------------------
// Collectives' descriptions.

enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast, reduce };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce:
      return "ncclAllReduce";
    case Kind::reduce_scatter:
      return "ncclReduceScatter";
    case Kind::all_gather:
      return "ncclAllGather";
    case Kind::broadcast:
      return "ncclBroadcast";
    case Kind::reduce:
      return "ncclReduce";
  }
  return "nccl?";
}

bool reduces(Kind k) { return k == Kind::all_reduce || k == Kind::reduce_scatter || k == Kind::reduce; }
bool rooted(Kind k) { return k == Kind::broadcast || k == Kind::reduce; }

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return "int8";
    case ncclUint8:
      return "uint8";
    case ncclInt32:
      return "int32";
    case ncclUint32:
      return "uint32";
    case ncclInt64:
      return "int64";
    case ncclUint64:
      return "uint64";
    case ncclFloat16:
      return "float16";
    case ncclFloat32:
      return "float32";
    case ncclFloat64:
      return "float64";
    case ncclBfloat16:
      return "bfloat16";
    default:
      return "an unsupported type";
  }
}

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;  // the fp8 types: not emulated
  }
}

const char* op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
      return "sum";
    case ncclProd:
      return "prod";
    case ncclMax:
      return "max";
    case ncclMin:
      return "min";
    case ncclAvg:
      return "avg";
    default:
      return "an unsupported op";
  }
}

/// One rank's call, as the rendezvous compares and executes it.
struct Call {
  Kind kind = Kind::all_reduce;
  std::size_t count = 0;  // NCCL's count: per rank for all-gather (send), reduce-scatter (receive)
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = -1;
  const void* send = nullptr;
  void* recv = nullptr;
  int rank = 0;
  std::uint64_t sequence = 0;

  std::string describe() const {
    std::string s = std::string(kind_name(kind)) + "(count " + std::to_string(count) + ", " + type_name(type);
    if (reduces(kind)) s += std::string(", ") + op_name(op);
    if (rooted(kind)) s += ", root " + std::to_string(root);
    return s + ") on rank " + std::to_string(rank);
  }
  bool agrees_with(const Call& o) const {
    return kind == o.kind && count == o.count && type == o.type && (!reduces(kind) || op == o.op) &&
           (!rooted(kind) || root == o.root);
  }
};

// ---------------------------------------------------------------------------------------------
// Communicators: a Group is what the ranks share, a Rank what one rank's handle holds.

/// One collective of the group, by sequence number: the calls that arrived, then the outcome.
struct Round {
  std::vector<const Call*> calls;
  int arrived = 0, departed = 0;
  bool computing = false, computed = false;
  std::vector<std::size_t> received;  // by rank: bytes of other ranks' buffers in its result
  std::string error;
};

struct Group;

/// A split of the parent, by its sequence number among the parent's splits.
struct SplitRound {
  struct Entry {
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    bool arrived = false;
  };
  struct Outcome {
    std::shared_ptr<Group> group;
    int rank = -1;
  };
  std::vector<Entry> entries;
  std::vector<Outcome> outcomes;
  int arrived = 0;
  bool done = false;
  bool aborted = false;  // a rank's pending child was aborted: the split will not complete
};

struct Group {
  explicit Group(int n) : nranks(n), taken(static_cast<std::size_t>(n), false) {}
  const int nranks;
  std::mutex m;
  std::condition_variable cv;  // joins, rounds, splits and aborts all notify it
  int joined = 0;
  std::vector<bool> taken;
  bool aborted = false;
  std::string abort_reason;
  std::map<std::uint64_t, Round> rounds;
  std::map<std::uint64_t, std::shared_ptr<SplitRound>> splits;
};

struct Rank {
  std::mutex m;  // lock order: Rank::m before Group::m
  std::condition_variable idle;
  std::shared_ptr<Group> group;  // null while a non-blocking split is pending
  int rank = -1;
  int device = 0;
  bool blocking = true;
  std::uint64_t next_sequence = 0;  // collectives issued (by the rank's own thread)
  std::uint64_t next_split = 0;
  int in_flight = 0;  // collectives enqueued and not yet finished
  std::vector<emu::NcclTraffic> traffic;  // finished collectives' traffic, until taken
  bool finalizing = false;
  ncclResult_t async_error = ncclSuccess;
  std::string last_error;
  // A pending split: the parent's group, the round and this rank's index in the parent.
  std::shared_ptr<Group> split_parent;
  std::shared_ptr<SplitRound> split;
  int parent_rank = -1;
  // Collectives of a non-blocking communicator whose call answered ncclInProgress. NCCL issues
  // such a call in the background and says so through ncclCommGetAsyncError; here it is put on
  // its stream when ncclCommGetAsyncError is next asked, and not before, so that work a caller
  // enqueues on the stream before the communicator settled runs before the collective, as it
  // may on a GPU.
  std::vector<std::function<void()>> unissued;
};

/// Whether a non-blocking communicator's collective answers ncclInProgress: half of them, drawn
/// from the rank, the call's sequence number and POLYSHARD_EMULATED_NCCL_SEED (default 1), so a
/// run is repeatable and another seed draws other calls.
bool answers_in_progress(int rank, std::uint64_t sequence) {
  static const std::uint64_t seed = [] {
    const char* v = std::getenv("POLYSHARD_EMULATED_NCCL_SEED");
    return v ? std::strtoull(v, nullptr, 10) : 1ull;
  }();
  return (polyshard::counter_bits(polyshard::splitmix64(seed) ^ static_cast<std::uint64_t>(rank), sequence) & 1u) != 0;
}

}  // namespace

/// The handle behind ncclComm_t (nccl.h leaves the struct to the library).
struct ncclComm {
  std::shared_ptr<Rank> rank;
};

namespace {

struct Registry {
  std::mutex m;
  std::set<ncclComm*> live;
  std::map<std::string, std::shared_ptr<Group>> initializing;  // by unique id, until every rank joined
};
// Never destroyed: a stream worker may still finish a collective while the process exits.
Registry& registry() {
  static auto* p = new Registry;
  return *p;
}

thread_local std::string t_last_error;
thread_local std::string t_error_text;  // what ncclGetLastError hands out
thread_local int t_group_depth = 0;

ncclResult_t fail(Rank* r, ncclResult_t rc, std::string message) {
  t_last_error = message;
  if (r) {
    std::lock_guard lock(r->m);
    r->last_error = std::move(message);
  }
  return rc;
}

std::shared_ptr<Rank> find(ncclComm_t comm) {
  std::lock_guard lock(registry().m);
  return registry().live.count(comm) ? comm->rank : nullptr;
}

/// A pending split becomes a communicator once every rank of the parent arrived. r.m held.
void resolve_split(Rank& r) {
  if (!r.split) return;
  std::lock_guard lock(r.split_parent->m);
  if (!r.split->done) return;
  const auto& outcome = r.split->outcomes[static_cast<std::size_t>(r.parent_rank)];
  r.group = outcome.group;
  r.rank = outcome.rank;
  r.split.reset();
  r.split_parent.reset();
}

/// The state ncclCommGetAsyncError reports. r.m held.
ncclResult_t state_of(Rank& r) {
  resolve_split(r);
  if (r.split) {
    std::lock_guard lock(r.split_parent->m);
    return (r.split_parent->aborted || r.split->aborted) ? ncclRemoteError : ncclInProgress;
  }
  if (r.async_error != ncclSuccess) return r.async_error;
  std::lock_guard lock(r.group->m);
  if (r.group->aborted) return ncclRemoteError;
  if (r.group->joined < r.group->nranks) return ncclInProgress;
  if (r.finalizing && r.in_flight > 0) return ncclInProgress;
  return ncclSuccess;
}

ncclComm_t publish(std::shared_ptr<Rank> r) {
  auto* c = new ncclComm{std::move(r)};
  std::lock_guard lock(registry().m);
  registry().live.insert(c);
  return c;
}

/// Takes the handle out of the registry; the Rank lives on in work that still holds it.
std::shared_ptr<Rank> retire(ncclComm_t comm) {
  std::lock_guard lock(registry().m);
  if (!registry().live.erase(comm)) return nullptr;
  auto r = std::move(comm->rank);
  delete comm;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Arithmetic. 16-bit floats reduce in float and round once at the end; integers wrap.

template <class T>
struct Arith {
  using A = T;
  static A load(T v) { return v; }
  static T store(A a) { return a; }
};
template <>
struct Arith<__half> {
  using A = float;
  static A load(__half v) { return __half2float(v); }
  static __half store(A a) { return __float2half_rn(a); }
};
template <>
struct Arith<__nv_bfloat16> {
  using A = float;
  static A load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __nv_bfloat16 store(A a) { return __float2bfloat16_rn(a); }
};

template <class A>
A combine(ncclRedOp_t op, A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;  // wrap-around, not undefined overflow
    switch (op) {
      case ncclProd:
        return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ncclMax:
        return std::max(a, b);
      case ncclMin:
        return std::min(a, b);
      default:
        return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));  // sum, avg
    }
  } else {
    switch (op) {
      case ncclProd:
        return a * b;
      // NaN wins, so that poisoned (unwritten) memory shows in the result.
      case ncclMax:
        return (std::isnan(a) || std::isnan(b)) ? a + b : std::max(a, b);
      case ncclMin:
        return (std::isnan(a) || std::isnan(b)) ? a + b : std::min(a, b);
      default:
        return a + b;
    }
  }
}

/// out[i] = op over ranks r = 0, 1, ... of in[r][offset + i]: the same order for every rank.
template <class T>
std::vector<T> reduce_elements(const std::vector<const Call*>& calls, ncclRedOp_t op, std::size_t offset,
                               std::size_t n) {
  using A = typename Arith<T>::A;
  std::vector<A> acc(n);
  const T* first = static_cast<const T*>(calls[0]->send) + offset;
  for (std::size_t i = 0; i < n; ++i) acc[i] = Arith<T>::load(first[i]);
  for (std::size_t r = 1; r < calls.size(); ++r) {
    const T* in = static_cast<const T*>(calls[r]->send) + offset;
    for (std::size_t i = 0; i < n; ++i) acc[i] = combine(op, acc[i], Arith<T>::load(in[i]));
  }
  std::vector<T> out(n);
  const auto ranks = static_cast<A>(calls.size());
  for (std::size_t i = 0; i < n; ++i) out[i] = Arith<T>::store(op == ncclAvg ? acc[i] / ranks : acc[i]);
  return out;
}

template <class F>
void with_type(ncclDataType_t t, F&& f) {
  switch (t) {
    case ncclInt8:
      return f(std::int8_t{});
    case ncclUint8:
      return f(std::uint8_t{});
    case ncclInt32:
      return f(std::int32_t{});
    case ncclUint32:
      return f(std::uint32_t{});
    case ncclInt64:
      return f(std::int64_t{});
    case ncclUint64:
      return f(std::uint64_t{});
    case ncclFloat16:
      return f(__half{});
    case ncclFloat32:
      return f(float{});
    case ncclFloat64:
      return f(double{});
    case ncclBfloat16:
      return f(__nv_bfloat16{});
    default:
      return;
  }
}

/// Computes every rank's result. Inputs are read whole before any output is written, so that
/// the in-place forms (an output overlapping its own input) need no care. Returns, by rank, the
/// bytes of other ranks' buffers that went into its result (nccl_traffic.hpp): `write` is told,
/// for each result, which ranks' inputs went into it and how many bytes of each.
std::vector<std::size_t> compute(const std::vector<const Call*>& calls) {
  const Call& c0 = *calls[0];
  const std::size_t n = calls.size(), count = c0.count, size = type_size(c0.type);
  std::vector<std::size_t> received(n, 0);
  const auto write = [&](const Call& c, const void* data, std::size_t bytes, const std::vector<std::size_t>& sources,
                         std::size_t bytes_per_source) {
    if (bytes) {
      std::memcpy(c.recv, data, bytes);
      emu::initcheck::written(c.recv, bytes);
    }
    for (std::size_t source : sources)
      if (source != static_cast<std::size_t>(c.rank)) received[static_cast<std::size_t>(c.rank)] += bytes_per_source;
  };
  std::vector<std::size_t> every_rank(n);
  for (std::size_t r = 0; r < n; ++r) every_rank[r] = r;
  const std::vector<std::size_t> root_only{static_cast<std::size_t>(std::max(c0.root, 0))};
  with_type(c0.type, [&](auto tag) {
    using T = decltype(tag);
    switch (c0.kind) {
      case Kind::all_reduce: {
        const auto out = reduce_elements<T>(calls, c0.op, 0, count);
        for (const Call* c : calls) write(*c, out.data(), count * size, every_rank, count * size);
        break;
      }
      case Kind::reduce: {
        const auto out = reduce_elements<T>(calls, c0.op, 0, count);
        write(*calls[static_cast<std::size_t>(c0.root)], out.data(), count * size, every_rank, count * size);
        break;
      }
      case Kind::reduce_scatter: {
        const auto out = reduce_elements<T>(calls, c0.op, 0, count * n);
        // Rank r's result reduces chunk r of every rank's input.
        for (std::size_t r = 0; r < n; ++r)
          write(*calls[r], out.data() + r * count, count * size, every_rank, count * size);
        break;
      }
      case Kind::all_gather: {
        std::vector<T> all(count * n);
        for (std::size_t r = 0; r < n; ++r)
          if (count) std::memcpy(all.data() + r * count, calls[r]->send, count * size);
        for (const Call* c : calls) write(*c, all.data(), count * n * size, every_rank, count * size);
        break;
      }
      case Kind::broadcast: {
        const Call& root = *calls[static_cast<std::size_t>(c0.root)];
        std::vector<T> data(count);
        if (count) std::memcpy(data.data(), root.send, count * size);
        for (const Call* c : calls) write(*c, data.data(), count * size, root_only, count * size);
        break;
      }
    }
  });
  return received;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

/// The collective's work on the rank's stream: arrive, wait for every rank (or an abort), and
/// let the last arrival compute everyone's result.
void rendezvous(Group& g, Rank& r, const Call& call) {
  const std::string where =
      std::string(kind_name(call.kind)) + " on rank " + std::to_string(call.rank) + " of " + std::to_string(g.nranks);
  std::unique_lock lock(g.m);
  if (g.aborted) {
    const std::string error = where + ": the communicator was aborted (" + g.abort_reason + ")";
    lock.unlock();
    fail(&r, ncclRemoteError, error);
    throw emu::DeviceFault{cudaErrorLaunchFailure, error};
  }
  Round& round = g.rounds[call.sequence];
  if (round.calls.empty()) round.calls.assign(static_cast<std::size_t>(g.nranks), nullptr);
  round.calls[static_cast<std::size_t>(call.rank)] = &call;
  if (++round.arrived == g.nranks) {
    for (const Call* other : round.calls)
      if (!other->agrees_with(*round.calls[0]) && round.error.empty())
        round.error = other->describe() + " does not match " + round.calls[0]->describe() + " (collective #" +
                      std::to_string(call.sequence) + " of the communicator)";
    if (round.error.empty()) {
      // Computed outside the lock; waiters do not leave on an abort once computing started, so
      // nobody's buffers change hands while they are written.
      round.computing = true;
      lock.unlock();
      try {
        round.received = compute(round.calls);
      } catch (const std::exception& e) {
        lock.lock();
        round.error = where + ": " + e.what();
        lock.unlock();
      }
      lock.lock();
    }
    round.computed = true;
    g.cv.notify_all();
  } else {
    g.cv.wait(lock, [&] { return round.computed || (g.aborted && !round.computing); });
  }
  std::string error = round.error;
  if (!round.computed) {
    std::vector<int> missing;
    for (int q = 0; q < g.nranks; ++q)
      if (!round.calls[static_cast<std::size_t>(q)]) missing.push_back(q);
    error = where + ": the communicator was aborted (" + g.abort_reason + ") while waiting for " + rank_list(missing);
  }
  const bool mismatch = round.computed && !round.error.empty();
  const std::size_t received = error.empty() ? round.received[static_cast<std::size_t>(call.rank)] : 0;
  if (++round.departed == round.arrived) g.rounds.erase(call.sequence);
  lock.unlock();
  if (error.empty()) {
    std::lock_guard rl(r.m);
    r.traffic.push_back({call.sequence, received});
  }
  if (!error.empty()) {
    fail(&r, ncclSuccess, error);
    {
      std::lock_guard rl(r.m);
      r.async_error = mismatch ? ncclInvalidUsage : ncclRemoteError;
    }
    throw emu::DeviceFault{cudaErrorLaunchFailure, error};
  }
}

/// Counts a collective as in flight for as long as its work exists (run, or skipped after a fault).
struct InFlight {
  explicit InFlight(std::shared_ptr<Rank> r) : rank(std::move(r)) {
    std::lock_guard lock(rank->m);
    ++rank->in_flight;
  }
  ~InFlight() {
    {
      std::lock_guard lock(rank->m);
      --rank->in_flight;
    }
    rank->idle.notify_all();
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  std::shared_ptr<Rank> rank;
};

/// Checks that [p, p + bytes) is device memory of `device`; empty, or why not.
std::string check_buffer(const char* role, const void* p, std::size_t bytes, int device) {
  if (bytes == 0) return {};
  const emu::PointerInfo info = emu::find_pointer(p);
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  const std::string head = std::string(role) + " " + text;
  if (info.kind != emu::MemoryKind::device) return head + " is not device memory";
  if (info.device != device)
    return head + " is memory of device " + std::to_string(info.device) + ", not of the communicator's device " +
           std::to_string(device);
  const auto offset = static_cast<std::size_t>(static_cast<const char*>(p) - static_cast<const char*>(info.base));
  if (bytes > info.size - offset)
    return head + ": " + std::to_string(bytes) + " bytes run past the end of its allocation of " +
           std::to_string(info.size) + " bytes";
  return {};
}

ncclResult_t collective(Kind kind, const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  const auto r = find(comm);
  if (!r) return fail(nullptr, ncclInvalidArgument, std::string(kind_name(kind)) + ": not a live communicator");
  std::shared_ptr<Group> g;
  int rank = 0, device = 0;
  {
    std::lock_guard lock(r->m);
    resolve_split(*r);
    g = r->group;
    rank = r->rank;
    device = r->device;
  }
  const std::string where = std::string(kind_name(kind)) + " on rank " + std::to_string(rank);
  if (!g) return fail(r.get(), ncclInvalidUsage, where + ": the communicator is still being split");
  std::string aborted;
  {
    std::lock_guard lock(g->m);
    if (g->aborted) aborted = g->abort_reason;
  }
  if (!aborted.empty())
    return fail(r.get(), ncclRemoteError, where + ": the communicator was aborted (" + aborted + ")");
  const std::size_t size = type_size(type);
  if (size == 0)
    return fail(r.get(), ncclInvalidArgument, where + ": data type " + std::to_string(type) + " is not emulated");
  if (reduces(kind) && (op < ncclSum || op > ncclAvg))
    return fail(r.get(), ncclInvalidArgument, where + ": reduction op " + std::to_string(op) + " is not emulated");
  if (rooted(kind) && (root < 0 || root >= g->nranks))
    return fail(r.get(), ncclInvalidArgument,
                where + ": root " + std::to_string(root) + " is not a rank of " + std::to_string(g->nranks));
  if (emu::stream_device(stream) != device)
    return fail(r.get(), ncclInvalidArgument,
                where + ": the stream is not a live stream of the communicator's device " + std::to_string(device));
  const auto n = static_cast<std::size_t>(g->nranks);
  std::size_t send_bytes = count * size, recv_bytes = count * size;
  if (kind == Kind::all_gather) recv_bytes *= n;
  if (kind == Kind::reduce_scatter) send_bytes *= n;
  if (kind == Kind::broadcast && rank != root) send_bytes = 0;  // only the root's is read
  if (kind == Kind::reduce && rank != root) recv_bytes = 0;     // only the root's is written
  std::string why = check_buffer("sendbuff", send, send_bytes, device);
  if (why.empty()) why = check_buffer("recvbuff", recv, recv_bytes, device);
  if (!why.empty()) return fail(r.get(), ncclInvalidArgument, where + ": " + why);

  Call call{kind, count, type, op, rooted(kind) ? root : -1, send, recv, rank, 0};
  {
    std::lock_guard lock(r->m);
    call.sequence = r->next_sequence++;
  }
  auto guard = std::make_shared<InFlight>(r);
  auto issue = [stream, kind, g, r, call, guard] {
    emu::enqueue(stream, kind_name(kind), [g, r, call, guard] { rendezvous(*g, *r, call); });
  };
  {
    std::lock_guard lock(r->m);
    // Behind a call still unissued, every later one waits too: they keep their order.
    if (!r->blocking && (!r->unissued.empty() || answers_in_progress(rank, call.sequence))) {
      r->unissued.emplace_back(std::move(issue));
      return ncclInProgress;
    }
  }
  issue();
  return ncclSuccess;
}

ncclResult_t init_rank(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: comm is null");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " ranks");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return fail(nullptr, ncclUnhandledCudaError, "ncclCommInitRank: no current CUDA device");
  const std::string key(id.internal, sizeof id.internal);
  std::shared_ptr<Group> g;
  {
    std::lock_guard lock(registry().m);
    auto& slot = registry().initializing[key];
    if (!slot) slot = std::make_shared<Group>(nranks);
    g = slot;
  }
  if (g->nranks != nranks)
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRank: rank " + std::to_string(rank) + " says " + std::to_string(nranks) +
                    " ranks, an earlier rank said " + std::to_string(g->nranks));
  bool complete = false;
  {
    std::lock_guard lock(g->m);
    if (g->taken[static_cast<std::size_t>(rank)])
      return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(rank) + " joined twice");
    g->taken[static_cast<std::size_t>(rank)] = true;
    complete = ++g->joined == g->nranks;
  }
  if (complete) {
    g->cv.notify_all();
    std::lock_guard lock(registry().m);
    const auto it = registry().initializing.find(key);
    if (it != registry().initializing.end() && it->second == g) registry().initializing.erase(it);
  }
  auto r = std::make_shared<Rank>();
  r->group = g;
  r->rank = rank;
  r->device = device;
  r->blocking = !config || config->blocking != 0;  // NCCL_CONFIG_UNDEF_INT: blocking, the default
  *comm = publish(r);
  if (!r->blocking) return ncclInProgress;  // even for the last rank: the state says when it is ready
  bool aborted = false;
  {
    std::unique_lock lock(g->m);
    g->cv.wait(lock, [&] { return g->joined == g->nranks || g->aborted; });
    aborted = g->joined < g->nranks;
  }
  return aborted ? fail(r.get(), ncclRemoteError, "ncclCommInitRank: aborted while waiting for the other ranks")
                 : ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

/// The last error's description: the communicator's, or the calling thread's without one.
const char* ncclGetLastError(ncclComm_t comm) {
  const auto r = comm ? find(comm) : nullptr;
  if (r) {
    std::lock_guard lock(r->m);
    t_error_text = r->last_error;
  } else {
    t_error_text = t_last_error;
  }
  return t_error_text.c_str();
}

/// Unique within the process (a counter) and across processes (the process id and the time).
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return ncclInvalidArgument;
  static std::atomic<std::uint64_t> counter{0};
  std::memset(uniqueId, 0, sizeof *uniqueId);
  const std::uint64_t words[] = {
      0x706f6c7973686172ULL,  // "polyshar"
      counter.fetch_add(1) + 1, static_cast<std::uint64_t>(::getpid()),
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::memcpy(uniqueId->internal, words, sizeof words);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, commId, rank, nullptr);
}

/// With config->blocking = 0 the call returns ncclInProgress at once and the communicator is
/// ready (ncclCommGetAsyncError: ncclSuccess) when every rank has joined.
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  return init_rank(comm, nranks, commId, rank, config);
}

/// One communicator over `ndev` devices from a single thread: rank i on devlist[i] (or device i).
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms || ndev < 1) return fail(nullptr, ncclInvalidArgument, "ncclCommInitAll: no communicators to create");
  auto g = std::make_shared<Group>(ndev);
  g->joined = ndev;
  std::fill(g->taken.begin(), g->taken.end(), true);
  for (int i = 0; i < ndev; ++i) {
    auto r = std::make_shared<Rank>();
    r->group = g;
    r->rank = i;
    r->device = devlist ? devlist[i] : i;
    comms[i] = publish(r);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  const auto r = find(comm);
  if (!r || !asyncError) return fail(nullptr, ncclInvalidArgument, "ncclCommGetAsyncError: not a live communicator");
  std::vector<std::function<void()>> issue;
  {
    std::lock_guard lock(r->m);
    issue.swap(r->unissued);
    *asyncError = state_of(*r);
  }
  // Issued now: the state reads ncclInProgress this once more, ncclSuccess after.
  for (auto& f : issue) f();
  if (!issue.empty() && *asyncError == ncclSuccess) *asyncError = ncclInProgress;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  const auto r = find(comm);
  if (!r || !count) return fail(nullptr, ncclInvalidArgument, "ncclCommCount: not a live communicator");
  std::lock_guard lock(r->m);
  resolve_split(*r);
  if (!r->group) return ncclInProgress;
  *count = r->group->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  const auto r = find(comm);
  if (!r || !rank) return fail(nullptr, ncclInvalidArgument, "ncclCommUserRank: not a live communicator");
  std::lock_guard lock(r->m);
  resolve_split(*r);
  if (!r->group) return ncclInProgress;
  *rank = r->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  const auto r = find(comm);
  if (!r || !device) return fail(nullptr, ncclInvalidArgument, "ncclCommCuDevice: not a live communicator");
  std::lock_guard lock(r->m);
  *device = r->device;
  return ncclSuccess;
}

/// Collective over the parent's ranks. Ranks passing the same color form a communicator, ranked
/// by (key, parent rank); NCCL_SPLIT_NOCOLOR gets none. A null config inherits the parent's
/// blocking mode.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  const auto r = find(comm);
  if (!r || !newcomm) return fail(nullptr, ncclInvalidArgument, "ncclCommSplit: not a live communicator");
  *newcomm = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(r.get(), ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color) + " is negative");
  std::shared_ptr<Group> g;
  int parent_rank = 0;
  bool blocking = true;
  std::uint64_t sequence = 0;
  {
    std::lock_guard lock(r->m);
    resolve_split(*r);
    g = r->group;
    parent_rank = r->rank;
    blocking = config ? config->blocking != 0 : r->blocking;
    sequence = r->next_split++;
  }
  if (!g) return fail(r.get(), ncclInvalidUsage, "ncclCommSplit: the parent is still being split");
  std::shared_ptr<SplitRound> round;
  {
    std::unique_lock lock(g->m);
    if (g->aborted) {
      lock.unlock();
      return fail(r.get(), ncclRemoteError, "ncclCommSplit: the parent was aborted");
    }
    auto& slot = g->splits[sequence];
    if (!slot) {
      slot = std::make_shared<SplitRound>();
      slot->entries.resize(static_cast<std::size_t>(g->nranks));
      slot->outcomes.resize(static_cast<std::size_t>(g->nranks));
    }
    round = slot;
    round->entries[static_cast<std::size_t>(parent_rank)] = {color, key, true};
    if (++round->arrived == g->nranks) {
      std::map<int, std::vector<int>> by_color;
      for (int q = 0; q < g->nranks; ++q)
        if (round->entries[static_cast<std::size_t>(q)].color != NCCL_SPLIT_NOCOLOR)
          by_color[round->entries[static_cast<std::size_t>(q)].color].push_back(q);
      for (auto& [c, members] : by_color) {
        std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
          return round->entries[static_cast<std::size_t>(a)].key < round->entries[static_cast<std::size_t>(b)].key;
        });
        auto child = std::make_shared<Group>(static_cast<int>(members.size()));
        child->joined = child->nranks;
        std::fill(child->taken.begin(), child->taken.end(), true);
        for (std::size_t i = 0; i < members.size(); ++i)
          round->outcomes[static_cast<std::size_t>(members[i])] = {child, static_cast<int>(i)};
      }
      round->done = true;
      g->splits.erase(sequence);
      g->cv.notify_all();
    }
  }
  if (blocking) {
    bool done = false;
    {
      std::unique_lock lock(g->m);
      g->cv.wait(lock, [&] { return round->done || round->aborted || g->aborted; });
      done = round->done;
    }
    if (!done) return fail(r.get(), ncclRemoteError, "ncclCommSplit: aborted before every rank arrived");
  }
  if (color == NCCL_SPLIT_NOCOLOR) return blocking ? ncclSuccess : ncclInProgress;
  auto child = std::make_shared<Rank>();
  child->device = r->device;
  child->blocking = blocking;
  child->split_parent = g;
  child->split = round;
  child->parent_rank = parent_rank;
  {
    std::lock_guard lock(child->m);
    resolve_split(*child);
  }
  *newcomm = publish(std::move(child));
  return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

/// Calls inside a group were enqueued as they were made, in order; nothing is left to launch.
ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  --t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::all_reduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::reduce_scatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::all_gather, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return collective(Kind::broadcast, buff, buff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

/// Waits for this rank's collectives to finish (blocking), or reports ncclInProgress until they
/// have (non-blocking, through ncclCommGetAsyncError).
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  const auto r = find(comm);
  if (!r) return fail(nullptr, ncclInvalidArgument, "ncclCommFinalize: not a live communicator");
  std::unique_lock lock(r->m);
  r->finalizing = true;
  if (!r->blocking) return r->in_flight > 0 ? ncclInProgress : ncclSuccess;
  r->idle.wait(lock, [&] { return r->in_flight == 0; });
  return ncclSuccess;
}

/// Frees the handle once this rank's collectives finished (ncclCommDestroy flushes, as finalize).
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  const auto r = retire(comm);
  if (!r) return fail(nullptr, ncclInvalidArgument, "ncclCommDestroy: not a live communicator");
  std::unique_lock lock(r->m);
  r->idle.wait(lock, [&] { return r->in_flight == 0; });
  return ncclSuccess;
}

/// Releases every rank's collectives waiting at the communicator (their work fails: a sticky
/// error on their device, ncclRemoteError from ncclCommGetAsyncError) and frees the handle at
/// once, without waiting for anything.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  const auto r = retire(comm);
  if (!r) return fail(nullptr, ncclInvalidArgument, "ncclCommAbort: not a live communicator");
  std::shared_ptr<Group> g, parent;
  std::shared_ptr<SplitRound> split;
  int rank = 0;
  {
    std::lock_guard lock(r->m);
    resolve_split(*r);
    g = r->group;
    parent = r->split_parent;
    split = r->split;
    rank = r->rank >= 0 ? r->rank : r->parent_rank;
  }
  if (g) {
    {
      std::lock_guard lock(g->m);
      if (!g->aborted) {
        g->aborted = true;
        g->abort_reason = "rank " + std::to_string(rank) + " called ncclCommAbort";
      }
    }
    g->cv.notify_all();
  } else if (parent) {
    // The handle's split is pending: the split fails, the parent stays usable.
    {
      std::lock_guard lock(parent->m);
      split->aborted = true;
    }
    parent->cv.notify_all();
  }
  return ncclSuccess;
}

}  // extern "C"

namespace polyshard::emulation {

ncclResult_t take_nccl_traffic(ncclComm_t comm, std::vector<NcclTraffic>& out) {
  const auto r = find(comm);
  if (!r) return fail(nullptr, ncclInvalidArgument, "take_nccl_traffic: not a live communicator");
  std::lock_guard lock(r->m);
  out.insert(out.end(), r->traffic.begin(), r->traffic.end());
  r->traffic.clear();
  return ncclSuccess;
}

}  // namespace polyshard::emulation
