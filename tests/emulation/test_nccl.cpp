// Tests of the emulated NCCL: every collective and op on 2, 3 and 4 rank threads against results
// computed on the host in rank order, in-place forms, 16-bit types, non-blocking init, split,
// a mismatched call, a missing rank released by abort, the end of a communicator's life, and
// the traffic each rank's results took from the others.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "polyshard/emulation/nccl_traffic.hpp"
#include "polyshard/emulation/runtime.hpp"

using namespace std::chrono_literals;
namespace emu = polyshard::emulation;

namespace {

// ---- Rank threads: Catch2 assertions belong to the main thread, so ranks throw and the main
// thread reports.

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

/// Whether a collective's call `rc` on a non-blocking communicator got it issued: ncclSuccess at
/// once, or ncclInProgress and then ncclCommGetAsyncError polled until it reads ncclSuccess, as
/// NCCL asks of such a communicator before anything else uses the stream.
bool issued(ncclResult_t rc, ncclComm_t comm) {
  if (rc == ncclSuccess) return true;
  if (rc != ncclInProgress) return false;
  ncclResult_t state = ncclInProgress;
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       state == ncclInProgress && std::chrono::steady_clock::now() < deadline;)
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
  return state == ncclSuccess;
}

/// Runs `body(rank)` on `n` threads, rank r on device r; returns what the ranks threw.
template <class F>
std::vector<std::string> run_ranks(int n, F body) {
  std::mutex m;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        expect(cudaSetDevice(r) == cudaSuccess, "cudaSetDevice");
        body(r);
      } catch (const std::exception& e) {
        std::lock_guard lock(m);
        failures.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  return failures;
}

#define CHECK_RANKS(failures)                                  \
  do {                                                         \
    const auto failures_ = (failures);                         \
    for (const auto& message : failures_) FAIL_CHECK(message); \
  } while (false)

ncclUniqueId make_id() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  return id;
}

// ---- Element types.

template <class T>
constexpr ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>)
    return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return ncclFloat64;
  else if constexpr (std::is_same_v<T, __half>)
    return ncclFloat16;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return ncclBfloat16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return ncclInt64;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return ncclUint8;
  else
    return ncclInt8;
}

template <class T>
constexpr bool is_16bit_float = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

/// The type a reduction accumulates in: float for the 16-bit floats, else the type itself.
template <class T>
using acc_t = std::conditional_t<is_16bit_float<T>, float, T>;

template <class T>
acc_t<T> widen(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return v;
}

template <class T>
T narrow(acc_t<T> a) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(a);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(a);
  else
    return a;
}

/// Rank r's element i: small values, exact in every type, negative ones where the type has them.
template <class T>
T input(int r, std::size_t i) {
  const int k = static_cast<int>((static_cast<std::size_t>(r) * 7 + i * 3) % 7);
  if constexpr (std::is_floating_point_v<acc_t<T>>)
    return narrow<T>(static_cast<acc_t<T>>((k - 3) * 0.75));
  else if constexpr (std::is_signed_v<T>)
    return static_cast<T>(k - 3);
  else
    return static_cast<T>(k + 1);
}

/// The host's reference: op over ranks 0, 1, ... in that order; integers wrap.
template <class T>
T reference(ncclRedOp_t op, int nranks, std::size_t i) {
  using A = acc_t<T>;
  A acc = widen(input<T>(0, i));
  for (int r = 1; r < nranks; ++r) {
    const A x = widen(input<T>(r, i));
    if constexpr (std::is_integral_v<A>) {
      const auto ua = static_cast<std::uint64_t>(acc), ux = static_cast<std::uint64_t>(x);
      switch (op) {
        case ncclProd:
          acc = static_cast<A>(ua * ux);
          break;
        case ncclMax:
          acc = acc < x ? x : acc;
          break;
        case ncclMin:
          acc = x < acc ? x : acc;
          break;
        default:
          acc = static_cast<A>(ua + ux);
          break;
      }
    } else {
      switch (op) {
        case ncclProd:
          acc = acc * x;
          break;
        case ncclMax:
          acc = acc < x ? x : acc;
          break;
        case ncclMin:
          acc = x < acc ? x : acc;
          break;
        default:
          acc = acc + x;
          break;
      }
    }
  }
  if (op == ncclAvg) acc = static_cast<A>(acc / static_cast<A>(nranks));
  return narrow<T>(acc);
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
double as_double(T v) {
  return static_cast<double>(widen(v));
}

/// Device memory of the calling rank's device.
template <class T>
struct Buffer {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Buffer(std::size_t count) : n(count) {
    expect(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)) == cudaSuccess, "cudaMalloc");
  }
  Buffer(const Buffer&) = delete;
  ~Buffer() { cudaFree(p); }
  void upload(const std::vector<T>& v, std::size_t offset = 0) {
    expect(cudaMemcpy(p + offset, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess, "upload");
  }
  std::vector<T> download(std::size_t offset = 0, std::size_t count = ~std::size_t{0}) const {
    std::vector<T> v(count == ~std::size_t{0} ? n - offset : count);
    expect(cudaMemcpy(v.data(), p + offset, v.size() * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess, "download");
    return v;
  }
};

template <class T>
std::vector<T> inputs(int r, std::size_t count, std::size_t first = 0) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input<T>(r, first + i);
  return v;
}

template <class T>
void expect_equal(const std::vector<T>& got, std::size_t i, const T& want, const std::string& what) {
  if (!same_bits(got[i], want))
    throw std::runtime_error(what + ": element " + std::to_string(i) + " is " + std::to_string(as_double(got[i])) +
                             ", expected " + std::to_string(as_double(want)));
}

/// Every collective and op on one rank, in place or not, checked against the host.
template <class T>
void every_collective(int rank, int n, ncclComm_t comm, cudaStream_t stream, bool in_place, std::size_t count) {
  const ncclDataType_t type = nccl_type<T>();
  const auto sync = [&] { expect(cudaStreamSynchronize(stream) == cudaSuccess, "cudaStreamSynchronize"); };
  const auto N = static_cast<std::size_t>(n);
  for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
    const std::string name = std::string("op ") + std::to_string(op);
    {  // all-reduce
      Buffer<T> send(count), recv(count);
      send.upload(inputs<T>(rank, count));
      expect(ncclAllReduce(send.p, in_place ? send.p : recv.p, count, type, op, comm, stream) == ncclSuccess,
             "ncclAllReduce");
      sync();
      const auto got = (in_place ? send : recv).download();
      for (std::size_t i = 0; i < count; ++i) expect_equal(got, i, reference<T>(op, n, i), "all-reduce " + name);
    }
    {  // reduce-scatter: element i of rank q's slice is element q*count + i of the whole
      Buffer<T> send(count * N), recv(count);
      send.upload(inputs<T>(rank, count * N));
      T* out = in_place ? send.p + rank * count : recv.p;
      expect(ncclReduceScatter(send.p, out, count, type, op, comm, stream) == ncclSuccess, "ncclReduceScatter");
      sync();
      const auto got = in_place ? send.download(rank * count, count) : recv.download();
      for (std::size_t i = 0; i < count; ++i)
        expect_equal(got, i, reference<T>(op, n, rank * count + i), "reduce-scatter " + name);
    }
    {  // reduce to a root that moves with the op
      const int root = static_cast<int>(op) % n;
      Buffer<T> send(count), recv(count);
      send.upload(inputs<T>(rank, count));
      expect(ncclReduce(send.p, in_place ? send.p : recv.p, count, type, op, root, comm, stream) == ncclSuccess,
             "ncclReduce");
      sync();
      const auto got = (in_place ? send : recv).download();
      for (std::size_t i = 0; i < count; ++i) {
        if (rank == root)
          expect_equal(got, i, reference<T>(op, n, i), "reduce " + name);
        else if (in_place)
          expect_equal(got, i, input<T>(rank, i), "reduce leaves a non-root's buffer " + name);
      }
    }
  }
  {  // all-gather: rank q's input lands at q*count; in place, each input already sits there
    Buffer<T> send(count), recv(count * N);
    const T* in = send.p;
    if (in_place) {
      recv.upload(inputs<T>(rank, count), rank * count);
      in = recv.p + rank * count;
    } else {
      send.upload(inputs<T>(rank, count));
    }
    expect(ncclAllGather(in, recv.p, count, type, comm, stream) == ncclSuccess, "ncclAllGather");
    sync();
    const auto got = recv.download();
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < count; ++i) expect_equal(got, q * count + i, input<T>(q, i), "all-gather");
  }
  for (int root = 0; root < n; ++root) {  // broadcast from every root
    Buffer<T> send(count), recv(count);
    send.upload(inputs<T>(rank, count));
    expect(ncclBroadcast(send.p, in_place ? send.p : recv.p, count, type, root, comm, stream) == ncclSuccess,
           "ncclBroadcast");
    sync();
    const auto got = (in_place ? send : recv).download();
    for (std::size_t i = 0; i < count; ++i) expect_equal(got, i, input<T>(root, i), "broadcast");
  }
}

}  // namespace

TEMPLATE_TEST_CASE("every collective and op matches the host's rank-order result", "[emulation][nccl]", float, double,
                   __half, __nv_bfloat16, std::int32_t, std::int64_t, std::uint8_t, std::int8_t) {
  const int n = GENERATE(2, 3, 4);
  const bool in_place = GENERATE(false, true);
  INFO(n << " ranks, " << (in_place ? "in place" : "out of place"));
  const ncclUniqueId id = make_id();
  CHECK_RANKS(run_ranks(n, [&](int rank) {
    ncclComm_t comm = nullptr;
    expect(ncclCommInitRank(&comm, n, id, rank) == ncclSuccess, "ncclCommInitRank");
    int count = 0, me = -1, device = -1;
    expect(ncclCommCount(comm, &count) == ncclSuccess && count == n, "ncclCommCount");
    expect(ncclCommUserRank(comm, &me) == ncclSuccess && me == rank, "ncclCommUserRank");
    expect(ncclCommCuDevice(comm, &device) == ncclSuccess && device == rank, "ncclCommCuDevice");
    cudaStream_t stream = nullptr;
    expect(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "cudaStreamCreate");
    for (std::size_t elements : {std::size_t{1}, std::size_t{37}})
      every_collective<TestType>(rank, n, comm, stream, in_place, elements);
    expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
    cudaStreamDestroy(stream);
  }));
}

TEST_CASE("results do not depend on the order in which ranks arrive", "[emulation][nccl]") {
  constexpr int n = 4;
  constexpr std::size_t count = 64;
  // Float sums whose rounding depends on the order of the terms: 1 + 1e8 - 1e8 + 1 is 1 in rank
  // order, 0 or 2 in others.
  const auto value = [](int r, std::size_t i) {
    constexpr float base[n] = {1.0f, 1.0e8f, -1.0e8f, 1.0f};
    return base[r] * static_cast<float>(1 + i % 3);
  };
  std::vector<float> want(count);
  for (std::size_t i = 0; i < count; ++i) {
    float acc = value(0, i);
    for (int r = 1; r < n; ++r) acc += value(r, i);
    want[i] = acc;
  }
  for (bool ascending : {true, false}) {
    const ncclUniqueId id = make_id();
    CHECK_RANKS(run_ranks(n, [&](int rank) {
      ncclComm_t comm = nullptr;
      expect(ncclCommInitRank(&comm, n, id, rank) == ncclSuccess, "init");
      cudaStream_t stream = nullptr;
      expect(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");
      Buffer<float> buf(count);
      std::vector<float> mine(count);
      for (std::size_t i = 0; i < count; ++i) mine[i] = value(rank, i);
      buf.upload(mine);
      const auto delay = std::chrono::milliseconds(20 * (ascending ? rank : n - 1 - rank));
      emu::enqueue(stream, "delay", [delay] { std::this_thread::sleep_for(delay); });
      expect(ncclAllReduce(buf.p, buf.p, count, ncclFloat32, ncclSum, comm, stream) == ncclSuccess, "all-reduce");
      expect(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
      const auto got = buf.download();
      for (std::size_t i = 0; i < count; ++i) expect_equal(got, i, want[i], "order-independent sum");
      expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
      cudaStreamDestroy(stream);
    }));
  }
}

TEST_CASE("calls inside a group run in order", "[emulation][nccl]") {
  const ncclUniqueId id = make_id();
  CHECK_RANKS(run_ranks(2, [&](int rank) {
    ncclComm_t comm = nullptr;
    expect(ncclCommInitRank(&comm, 2, id, rank) == ncclSuccess, "init");
    Buffer<double> a(3), b(3);
    a.upload({1.0 + rank, 2.0, 3.0});
    b.upload({10.0 * rank, 0.0, 0.0});
    expect(ncclGroupStart() == ncclSuccess, "group start");
    expect(ncclAllReduce(a.p, a.p, 3, ncclFloat64, ncclSum, comm, nullptr) == ncclSuccess, "a");
    expect(ncclBroadcast(b.p, b.p, 3, ncclFloat64, 1, comm, nullptr) == ncclSuccess, "b");
    expect(ncclGroupEnd() == ncclSuccess, "group end");
    expect(cudaStreamSynchronize(nullptr) == cudaSuccess, "sync");
    expect(a.download() == std::vector<double>{3.0, 4.0, 6.0}, "all-reduce in a group");
    expect(b.download() == std::vector<double>{10.0, 0.0, 0.0}, "broadcast in a group");
    expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  }));
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
}

TEST_CASE("a non-blocking init is in progress until every rank joined", "[emulation][nccl]") {
  const ncclUniqueId id = make_id();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comms[2] = {nullptr, nullptr};
  ncclResult_t state = ncclSuccess;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(ncclCommInitRankConfig(&comms[0], 2, id, 0, &config) == ncclInProgress);
  REQUIRE(ncclCommGetAsyncError(comms[0], &state) == ncclSuccess);
  CHECK(state == ncclInProgress);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  CHECK(ncclCommInitRankConfig(&comms[1], 2, id, 1, &config) == ncclInProgress);
  for (ncclComm_t c : comms) {
    REQUIRE(ncclCommGetAsyncError(c, &state) == ncclSuccess);
    CHECK(state == ncclSuccess);
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  // The communicator works: one all-reduce on each rank's thread.
  CHECK_RANKS(run_ranks(2, [&](int rank) {
    Buffer<float> buf(5);
    buf.upload(std::vector<float>(5, 1.5f + rank));
    expect(issued(ncclAllReduce(buf.p, buf.p, 5, ncclFloat32, ncclMax, comms[rank], nullptr), comms[rank]),
           "all-reduce");
    expect(cudaStreamSynchronize(nullptr) == cudaSuccess, "sync");
    expect(buf.download() == std::vector<float>(5, 2.5f), "max");
  }));
  for (ncclComm_t c : comms) {
    const ncclResult_t rc = ncclCommFinalize(c);
    CHECK((rc == ncclSuccess || rc == ncclInProgress));
    for (auto deadline = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < deadline;) {
      REQUIRE(ncclCommGetAsyncError(c, &state) == ncclSuccess);
      if (state != ncclInProgress) break;
      std::this_thread::sleep_for(1ms);
    }
    CHECK(state == ncclSuccess);
    CHECK(ncclCommDestroy(c) == ncclSuccess);
  }
}

TEST_CASE("a non-blocking communicator's collective that answers ncclInProgress is issued when the state is read",
          "[emulation][nccl]") {
  // Each rank adds (rank + 1) * 10 + round over 2 ranks; where a call answered ncclInProgress, a
  // copy put on the stream before polling the state runs before the collective and sees the
  // rank's own value, as it may on a GPU; after the poll the sum arrives.
  const ncclUniqueId id = make_id();
  constexpr int rounds = 12;
  std::vector<int> in_progress(2, 0);
  CHECK_RANKS(run_ranks(2, [&](int rank) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t init = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
    expect(issued(init, comm), "init");
    Buffer<std::int32_t> value(1);
    for (int round = 0; round < rounds; ++round) {
      const std::int32_t mine = (rank + 1) * 10 + round;
      value.upload({mine});
      const ncclResult_t rc = ncclAllReduce(value.p, value.p, 1, ncclInt32, ncclSum, comm, nullptr);
      std::int32_t early = -1;
      if (rc == ncclInProgress) {
        ++in_progress[std::size_t(rank)];
        expect(cudaMemcpyAsync(&early, value.p, sizeof early, cudaMemcpyDeviceToHost, nullptr) == cudaSuccess, "copy");
      }
      expect(issued(rc, comm), "the all-reduce is issued");
      expect(cudaStreamSynchronize(nullptr) == cudaSuccess, "sync");
      if (rc == ncclInProgress) expect(early == mine, "a copy enqueued before the poll ran before the collective");
      expect(value.download()[0] == 30 + 2 * round, "the sum, once issued");
    }
    expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  }));
  // Drawn from the default seed: some calls answer ncclInProgress, and not all.
  const int answered = in_progress[0] + in_progress[1];
  CHECK(answered > 0);
  CHECK(answered < 2 * rounds);
}

TEST_CASE("split makes one communicator per color, ranked by key", "[emulation][nccl]") {
  constexpr int n = 4;
  const ncclUniqueId id = make_id();
  const bool blocking = GENERATE(true, false);
  INFO((blocking ? "blocking" : "non-blocking") << " split");
  CHECK_RANKS(run_ranks(n, [&](int rank) {
    ncclComm_t parent = nullptr;
    expect(ncclCommInitRank(&parent, n, id, rank) == ncclSuccess, "init");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking ? 1 : 0;
    const auto settle = [&](ncclComm_t c) {
      ncclResult_t state = ncclInProgress;
      for (auto deadline = std::chrono::steady_clock::now() + 10s;
           state == ncclInProgress && std::chrono::steady_clock::now() < deadline;)
        expect(ncclCommGetAsyncError(c, &state) == ncclSuccess, "ncclCommGetAsyncError");
      expect(state == ncclSuccess, "the split communicator became ready");
    };

    // Even and odd ranks, each ordered by descending parent rank (key = -rank).
    ncclComm_t half = nullptr;
    const ncclResult_t rc = ncclCommSplit(parent, rank % 2, -rank, &half, &config);
    expect(rc == (blocking ? ncclSuccess : ncclInProgress), "ncclCommSplit");
    expect(half != nullptr, "a communicator for a color");
    settle(half);
    int count = 0, me = -1;
    expect(ncclCommCount(half, &count) == ncclSuccess && count == 2, "two ranks per color");
    expect(ncclCommUserRank(half, &me) == ncclSuccess && me == (rank < 2 ? 1 : 0), "ranked by key");
    Buffer<std::int32_t> who(1);
    who.upload({rank});
    expect(issued(ncclAllReduce(who.p, who.p, 1, ncclInt32, ncclSum, half, nullptr), half), "all-reduce");
    expect(cudaStreamSynchronize(nullptr) == cudaSuccess, "sync");
    expect(who.download()[0] == (rank % 2 ? 1 + 3 : 0 + 2), "members of the color");

    // Rank 3 opts out; the others keep their order.
    ncclComm_t three = nullptr;
    const ncclResult_t rc3 = ncclCommSplit(parent, rank == 3 ? NCCL_SPLIT_NOCOLOR : 7, rank, &three, &config);
    expect(rc3 == (blocking ? ncclSuccess : ncclInProgress), "ncclCommSplit without rank 3");
    if (rank == 3) {
      expect(three == nullptr, "NCCL_SPLIT_NOCOLOR gives no communicator");
    } else {
      settle(three);
      expect(ncclCommCount(three, &count) == ncclSuccess && count == 3, "three ranks");
      expect(ncclCommUserRank(three, &me) == ncclSuccess && me == rank, "same order");
      expect(ncclCommDestroy(three) == ncclSuccess, "destroy");
    }
    expect(ncclCommDestroy(half) == ncclSuccess, "destroy");
    expect(ncclCommDestroy(parent) == ncclSuccess, "destroy");
  }));
}

TEST_CASE("mismatched calls are a fault naming both", "[emulation][nccl]") {
  const ncclUniqueId id = make_id();
  std::vector<ncclResult_t> states(2, ncclSuccess);
  CHECK_RANKS(run_ranks(2, [&](int rank) {
    ncclComm_t comm = nullptr;
    expect(ncclCommInitRank(&comm, 2, id, rank) == ncclSuccess, "init");
    Buffer<float> buf(8);
    if (rank == 0)
      expect(ncclAllReduce(buf.p, buf.p, 8, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess, "a");
    else
      expect(ncclBroadcast(buf.p, buf.p, 8, ncclFloat32, 0, comm, nullptr) == ncclSuccess, "b");
    expect(cudaStreamSynchronize(nullptr) == cudaErrorLaunchFailure, "the stream reports the fault");
    expect(ncclCommGetAsyncError(comm, &states[static_cast<std::size_t>(rank)]) == ncclSuccess, "async error");
    expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    expect(cudaDeviceReset() == cudaSuccess, "reset");
  }));
  CHECK_THAT(emu::last_fault_message(), Catch::Contains("does not match") && Catch::Contains("ncclAllReduce(count 8") &&
                                            Catch::Contains("ncclBroadcast(count 8, float32, root 0) on rank 1"));
  CHECK(states == std::vector<ncclResult_t>{ncclInvalidUsage, ncclInvalidUsage});
}

TEST_CASE("abort releases a collective waiting for a rank that never comes", "[emulation][nccl]") {
  const ncclUniqueId id = make_id();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comms[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    REQUIRE(ncclCommInitRankConfig(&comms[r], 2, id, r, &config) == ncclInProgress);
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  std::atomic<bool> finished{false};
  cudaError_t synced = cudaSuccess;
  ncclResult_t enqueued = ncclSuccess;
  // Rank 0 calls; rank 1 never does. (In synchronous mode the call itself waits.)
  std::thread rank0([&] {
    cudaSetDevice(0);
    float* buf = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&buf), 16 * sizeof(float));
    enqueued = ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, comms[0], nullptr);
    if (enqueued == ncclInProgress) {  // one poll issues it (and reads ncclInProgress that once)
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comms[0], &state);
    }
    synced = cudaStreamSynchronize(nullptr);
    cudaFree(buf);
    finished = true;
  });
  std::this_thread::sleep_for(200ms);
  CHECK_FALSE(finished.load());  // blocked, as on a GPU
  ncclResult_t state = ncclSuccess;
  REQUIRE(ncclCommGetAsyncError(comms[0], &state) == ncclSuccess);
  CHECK(state == ncclSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(ncclCommAbort(comms[0]) == ncclSuccess);
  while (!finished.load() && std::chrono::steady_clock::now() - t0 < 10s) std::this_thread::sleep_for(1ms);
  CHECK(finished.load());
  rank0.join();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK((enqueued == ncclSuccess || enqueued == ncclInProgress));
  CHECK(synced == cudaErrorLaunchFailure);
  CHECK_THAT(emu::last_fault_message(), Catch::Contains("ncclAllReduce on rank 0 of 2") && Catch::Contains("aborted") &&
                                            Catch::Contains("waiting for rank 1"));
  REQUIRE(ncclCommGetAsyncError(comms[1], &state) == ncclSuccess);
  CHECK(state == ncclRemoteError);                                        // the other rank learns of it
  CHECK(ncclCommGetAsyncError(comms[0], &state) == ncclInvalidArgument);  // the aborted handle is gone
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  Buffer<float> late(4);
  CHECK(ncclAllReduce(late.p, late.p, 4, ncclFloat32, ncclSum, comms[1], nullptr) == ncclRemoteError);
  CHECK_THAT(std::string(ncclGetLastError(comms[1])), Catch::Contains("aborted"));
  CHECK(ncclCommDestroy(comms[1]) == ncclSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  CHECK(cudaDeviceReset() == cudaSuccess);
}

TEST_CASE("buffers must be device memory of the communicator's device", "[emulation][nccl]") {
  const ncclUniqueId id = make_id();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  float* other = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&other), 64) == cudaSuccess);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  float* mine = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&mine), 64) == cudaSuccess);
  CHECK(ncclAllReduce(other, mine, 16, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK_THAT(std::string(ncclGetLastError(comm)), Catch::Contains("sendbuff") && Catch::Contains("device 0"));
  CHECK(ncclAllReduce(mine, mine, 17, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK_THAT(std::string(ncclGetLastError(comm)), Catch::Contains("past the end"));
  std::vector<float> host(16);
  CHECK(ncclAllReduce(host.data(), mine, 16, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(mine, mine, 16, ncclFloat8e4m3, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclBroadcast(mine, mine, 16, ncclFloat32, 1, comm, nullptr) == ncclInvalidArgument);
  // One rank alone: the all-reduce is a copy.
  std::vector<float> ones(16, 1.0f);
  REQUIRE(cudaMemcpy(mine, ones.data(), 64, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(ncclAllReduce(mine, mine, 16, ncclFloat32, ncclAvg, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaMemcpy(host.data(), mine, 64, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(host == ones);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(cudaFree(mine) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  CHECK(cudaFree(other) == cudaSuccess);
}

TEST_CASE("finalize flushes, destroy ends a communicator", "[emulation][nccl]") {
  const ncclUniqueId id = make_id();
  CHECK_RANKS(run_ranks(2, [&](int rank) {
    ncclComm_t comm = nullptr;
    expect(ncclCommInitRank(&comm, 2, id, rank) == ncclSuccess, "init");
    cudaStream_t stream = nullptr;
    expect(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");
    Buffer<double> buf(100);
    buf.upload(std::vector<double>(100, 1.0 + rank));
    emu::enqueue(stream, "delay", [] { std::this_thread::sleep_for(50ms); });
    expect(ncclAllReduce(buf.p, buf.p, 100, ncclFloat64, ncclSum, comm, stream) == ncclSuccess, "all-reduce");
    expect(ncclCommFinalize(comm) == ncclSuccess, "a blocking finalize waits");
    expect(cudaStreamQuery(stream) == cudaSuccess, "the collective is done after finalize");
    expect(buf.download() == std::vector<double>(100, 3.0), "sum");
    ncclResult_t state = ncclInProgress;
    expect(ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclSuccess, "finalized");
    expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    expect(ncclCommDestroy(comm) == ncclInvalidArgument, "a destroyed handle is gone");
    expect(ncclAllReduce(buf.p, buf.p, 100, ncclFloat64, ncclSum, comm, stream) == ncclInvalidArgument,
           "no collective on a destroyed handle");
    cudaStreamDestroy(stream);
  }));
}

TEST_CASE("ids are unique, versions and error strings are NCCL's", "[emulation][nccl]") {
  const ncclUniqueId a = make_id(), b = make_id();
  CHECK(std::memcmp(&a, &b, sizeof a) != 0);
  int version = 0;
  REQUIRE(ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);
  CHECK(std::string(ncclGetErrorString(ncclSuccess)) == "no error");
  CHECK(std::string(ncclGetErrorString(ncclInProgress)) == "NCCL operation in progress");
  CHECK(std::string(ncclGetErrorString(ncclInvalidArgument)) == "invalid argument");
}

TEST_CASE("each rank's traffic: what its results took from other ranks, by call number, once", "[emulation][nccl]") {
  const ncclUniqueId id = make_id();
  const int n = 3;
  std::vector<std::vector<emu::NcclTraffic>> taken(n), again(n);
  CHECK_RANKS(run_ranks(n, [&](int rank) {
    ncclComm_t comm = nullptr;
    expect(ncclCommInitRank(&comm, n, id, rank) == ncclSuccess, "init");
    cudaStream_t other = nullptr;
    expect(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess, "stream");
    Buffer<float> small(5), all(5 * n);
    Buffer<double> wide(7);
    // Calls 0 and 1 on the default stream, call 2 on another one: numbered in issue order.
    expect(ncclAllGather(small.p, all.p, 5, ncclFloat32, comm, nullptr) == ncclSuccess, "all-gather");
    expect(ncclReduce(wide.p, wide.p, 7, ncclFloat64, ncclSum, 1, comm, nullptr) == ncclSuccess, "reduce");
    expect(cudaStreamSynchronize(nullptr) == cudaSuccess, "sync");
    expect(ncclBroadcast(wide.p, wide.p, 7, ncclFloat64, 2, comm, other) == ncclSuccess, "broadcast");
    expect(cudaStreamSynchronize(other) == cudaSuccess, "sync other");
    auto& mine = taken[static_cast<std::size_t>(rank)];
    expect(emu::take_nccl_traffic(comm, mine) == ncclSuccess, "take");
    expect(emu::take_nccl_traffic(comm, again[static_cast<std::size_t>(rank)]) == ncclSuccess, "take again");
    expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    std::vector<emu::NcclTraffic> none;
    expect(emu::take_nccl_traffic(comm, none) == ncclInvalidArgument, "a destroyed handle has no traffic");
    cudaStreamDestroy(other);
  }));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const auto& t = taken[static_cast<std::size_t>(r)];
    REQUIRE(t.size() == 3);
    std::vector<std::size_t> bytes(3, 99);
    for (const emu::NcclTraffic& x : t)
      if (x.call < 3) bytes[x.call] = x.bytes;
    CHECK(bytes[0] == 2 * 5 * sizeof(float));               // the two other ranks' chunks
    CHECK(bytes[1] == (r == 1 ? 2 * 7 * sizeof(double) : 0));  // only the root's result
    CHECK(bytes[2] == (r == 2 ? 0 : 7 * sizeof(double)));      // the root's buffer, to the others
    CHECK(again[static_cast<std::size_t>(r)].empty());         // taken once
  }
}
