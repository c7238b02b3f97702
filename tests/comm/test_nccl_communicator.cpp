// Tests of the NCCL backend: it compiles and satisfies Communicator everywhere, reports a
// missing GPU cleanly, and (tag [.gpu]) runs every collective with one rank per visible GPU,
// bootstrapped over the in-process backend, and stops ranks that issue different collectives.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/collective_checks.hpp"
#include "polyshard/comm/call_site.hpp"
#include "polyshard/comm/nccl_communicator.hpp"
#include "polyshard/comm/thread_communicator.hpp"
#include "support/gpu_devices.hpp"

using namespace polyshard;
using namespace std::chrono_literals;

static_assert(Communicator<NcclCommunicator>);

namespace {

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceBuffer(std::size_t count) : n(count) {
    if (n && cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T)) != cudaSuccess) test_comm::fail("cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  std::span<T> span() { return {ptr, n}; }
  void upload(const std::vector<T>& v) {
    if (n) cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    if (n) cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

/// Every collective with one rank per GPU; NCCL's own reduction order is not ours, so results
/// are checked against the exact sum within the tolerance of T.
template <class T>
void check_nccl(NcclCommunicator& comm) {
  const int N = comm.size(), r = comm.rank();
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1021}}) {
    const auto xs = test_comm::all_inputs<T>(N, n, 9);
    DeviceBuffer<T> buf(n);
    buf.upload(xs[r]);
    comm.all_reduce(buf.span(), ReduceOp::Sum);
    auto got = buf.download();
    for (std::size_t i = 0; i < n; ++i)
      if (std::abs(static_cast<double>(static_cast<compute_t<T>>(got[i])) - test_comm::exact_sum(xs, i, ReduceOp::Sum)) >
          test_comm::tolerance<T>(N) * 4)
        test_comm::fail("NCCL all_reduce wrong at ", i);
    test_comm::expect_bytes(comm, CollectiveKind::AllReduce, static_cast<double>(n * sizeof(T)));

    const auto big = test_comm::all_inputs<T>(N, n * N, 10);
    DeviceBuffer<T> in(n * N), out(n);
    in.upload(big[r]);
    comm.reduce_scatter(std::span<const T>(in.span()), out.span(), ReduceOp::Avg);
    got = out.download();
    for (std::size_t i = 0; i < n; ++i)
      if (std::abs(static_cast<double>(static_cast<compute_t<T>>(got[i])) -
                   test_comm::exact_sum(big, n * r + i, ReduceOp::Avg)) > test_comm::tolerance<T>(N) * 4)
        test_comm::fail("NCCL reduce_scatter wrong at ", i);
    test_comm::expect_bytes(comm, CollectiveKind::ReduceScatter, static_cast<double>(n * N * sizeof(T)));

    DeviceBuffer<T> gathered(n * N);
    buf.upload(xs[r]);
    comm.all_gather(std::span<const T>(buf.span()), gathered.span());
    got = gathered.download();
    for (int q = 0; q < N; ++q)
      for (std::size_t i = 0; i < n; ++i)
        if (!test_comm::same_bits(got[n * q + i], xs[q][i])) test_comm::fail("NCCL all_gather wrong");
    test_comm::expect_bytes(comm, CollectiveKind::AllGather, static_cast<double>(n * N * sizeof(T)));

    buf.upload(xs[r]);
    comm.broadcast(buf.span(), N - 1);
    got = buf.download();
    for (std::size_t i = 0; i < n; ++i)
      if (!test_comm::same_bits(got[i], xs[N - 1][i])) test_comm::fail("NCCL broadcast wrong");
    test_comm::expect_bytes(comm, CollectiveKind::Broadcast, static_cast<double>(n * sizeof(T)));

    buf.upload(xs[r]);
    CommHandle h = comm.reduce_async(buf.span(), 0, ReduceOp::Sum);
    h.wait();
    got = buf.download();
    if (r == 0)
      for (std::size_t i = 0; i < n; ++i)
        if (std::abs(static_cast<double>(static_cast<compute_t<T>>(got[i])) - test_comm::exact_sum(xs, i, ReduceOp::Sum)) >
            test_comm::tolerance<T>(N) * 4)
          test_comm::fail("NCCL reduce wrong at ", i);
    test_comm::expect_bytes(comm, CollectiveKind::Reduce, static_cast<double>(n * sizeof(T)));
  }
  comm.barrier();
  NcclCommunicator alone = comm.split(r, 0);
  if (alone.size() != 1 || alone.rank() != 0) test_comm::fail("NCCL split by rank: size ", alone.size());
}

}  // namespace

TEST_CASE("NCCL communicator reports a missing GPU cleanly", "[comm][nccl]") {
  if (NcclCommunicator::device_count() > 0) {
    SUCCEED("a GPU is visible: the [.gpu] test runs the NCCL backend");
    return;
  }
  ncclUniqueId id{};
  CHECK_THROWS_WITH(NcclCommunicator(0, 1, id, 0), Catch::Contains("needs CUDA device 0") && Catch::Contains("no GPU"));
}

TEST_CASE("NCCL collectives, one rank per GPU", "[comm][nccl][.gpu]") {
  if (!test::have_devices(1)) return;
  const int gpus = NcclCommunicator::device_count();
  const int world = std::min(gpus, 4);
  INFO("NCCL ranks: " << world);
  REQUIRE_NOTHROW(run_ranks(world, [](ThreadCommunicator& boot) {
    CommOptions options;
    options.timeout = 60s;
    NcclCommunicator comm = NcclCommunicator::bootstrap(boot, boot.rank(), options);
    check_nccl<float>(comm);
    check_nccl<double>(comm);
    check_nccl<polyshard::half>(comm);
    check_nccl<polyshard::bfloat16>(comm);
  }));
}

TEST_CASE("NCCL: ranks that issue different collectives fail on every rank, naming each rank's call",
          "[comm][nccl][.gpu]") {
  if (!test::have_devices(2)) return;
  const int gpus = NcclCommunicator::device_count();
  const int world = std::min(gpus, 3);
  const int last = world - 1;
  // Each case: what every rank called, and what must appear in every rank's error.
  struct Case {
    const char* name;
    std::function<void(NcclCommunicator&, DeviceBuffer<float>&, DeviceBuffer<float>&)> body;
    std::vector<std::string> expected;
  };
  const std::string others = "rank 0 called all_reduce(F32, 8 elements, sum)";
  const std::vector<Case> cases = {
      {"another collective",
       [&](NcclCommunicator& c, DeviceBuffer<float>& small, DeviceBuffer<float>& big) {
         if (c.rank() == last) c.all_gather(std::span<const float>(small.span().first(8)), big.span().first(8 * c.size()));
         else c.all_reduce(small.span().first(8));
       },
       {others, "rank " + std::to_string(last) + " called all_gather(F32, 8 elements)"}},
      {"another size",
       [&](NcclCommunicator& c, DeviceBuffer<float>& small, DeviceBuffer<float>&) {
         c.all_reduce(small.span().first(c.rank() == last ? 7 : 8));
       },
       {others, "rank " + std::to_string(last) + " called all_reduce(F32, 7 elements, sum)"}},
      {"another call site, behind a collective in flight",
       [&](NcclCommunicator& c, DeviceBuffer<float>& small, DeviceBuffer<float>&) {
         CommHandle first;
         {
           CallSite site("the first reduction");
           first = c.all_reduce_async(small.span().first(8));
         }
         CallSite site(c.rank() == last ? "the gradient norm" : "the overflow check");
         CommHandle second = c.all_reduce_async(small.span().first(8));
         first.wait();
         second.wait();
       },
       {"rank 0 called all_reduce(F32, 8 elements, sum) from the overflow check",
        "rank " + std::to_string(last) + " called all_reduce(F32, 8 elements, sum) from the gradient norm"}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    REQUIRE_NOTHROW(run_ranks(world, [&](ThreadCommunicator& boot) {
      {
        CommOptions options;
        options.timeout = 20s;
        NcclCommunicator comm = NcclCommunicator::bootstrap(boot, boot.rank(), options);
        DeviceBuffer<float> small(8), big(8 * static_cast<std::size_t>(world));
        try {
          c.body(comm, small, big);
          errors[static_cast<std::size_t>(boot.rank())] = "(no error)";
        } catch (const Error& e) {
          errors[static_cast<std::size_t>(boot.rank())] = e.what();
        }
        try {  // the communicator is aborted: later calls fail at once, never hang
          comm.all_reduce(small.span().first(8));
          errors[static_cast<std::size_t>(boot.rank())] += " | a later call ran";
        } catch (const Error&) {
        }
      }
      // An aborted collective may leave the device with an error (the emulated device keeps
      // it, as a GPU keeps a kernel's fault): the next case starts on a clean one.
      cudaDeviceReset();
    }));
    for (int r = 0; r < world; ++r) {
      const std::string& e = errors[static_cast<std::size_t>(r)];
      INFO("rank " << r << ": " << e);
      CHECK_THAT(e, Catch::Contains("mismatched collectives (NCCL) seen by rank " + std::to_string(r)));
      for (const std::string& part : c.expected) CHECK_THAT(e, Catch::Contains(part));
      CHECK_THAT(e, !Catch::Contains("a later call ran"));
    }
  }
}

TEST_CASE("NCCL: a rank that stops calling makes the other ranks fail, the first at its timeout naming the ranks it "
          "waited for",
          "[comm][nccl][.gpu]") {
  if (!test::have_devices(2)) return;
  const int gpus = NcclCommunicator::device_count();
  const int world = std::min(gpus, 3);
  const int silent = world - 1;  // alive, but issues no collective until the others have failed
  constexpr auto timeout = 500ms;
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::chrono::steady_clock::duration> waited(static_cast<std::size_t>(world));
  std::mutex mutex;
  std::condition_variable changed;
  int failed = 0;
  REQUIRE_NOTHROW(run_ranks(world, [&](ThreadCommunicator& boot) {
    const auto r = static_cast<std::size_t>(boot.rank());
    {
      // Created with the default timeout (an emulated or loaded start-up can be slow); the
      // short one applies to the collective.
      NcclCommunicator comm = NcclCommunicator::bootstrap(boot, boot.rank());
      comm.set_timeout(timeout);
      DeviceBuffer<float> x(8);
      if (boot.rank() == silent) {
        std::unique_lock lock(mutex);
        if (!changed.wait_for(lock, 120s, [&] { return failed == world - 1; }))
          errors[r] = "the other ranks did not fail within 120 s";
      } else {
        const auto start = std::chrono::steady_clock::now();
        try {
          comm.all_reduce(x.span());
          errors[r] = "(no error)";
        } catch (const Error& e) {
          errors[r] = e.what();
        }
        waited[r] = std::chrono::steady_clock::now() - start;
        std::lock_guard lock(mutex);
        ++failed;
        changed.notify_all();
      }
    }
    cudaDeviceReset();  // the aborted collective may leave the device with an error
  }));
  // A rank that times out aborts its communicator, which fails the others' calls where they wait
  // (an NCCL error, or the aborted kernel's fault on the stream, as on a GPU): at least one rank
  // reports the timeout itself, and every rank that called fails naming its call.
  const std::string seconds = " timed out after 0.5 s waiting for ";
  int timed_out = 0;
  for (int r = 0; r < world; ++r) {
    const std::string& e = errors[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << e);
    if (r == silent) {
      CHECK(e.empty());
      continue;
    }
    CHECK_THAT(e, Catch::StartsWith("polyshard: all_reduce(F32, 8 elements, sum) on rank " + std::to_string(r) +
                                    " of " + std::to_string(world) + " (NCCL"));
    if (e.find(seconds) == std::string::npos) continue;  // a peer's abort reached this rank first
    ++timed_out;
    // NCCL cannot tell which peer is missing: the message names every rank the call waited for.
    std::string waited_for;
    for (int q = 0; q < world; ++q)
      if (q != r) waited_for += (waited_for.empty() ? "" : ", ") + std::to_string(q);
    CHECK_THAT(e, Catch::EndsWith(seconds + (world == 2 ? "rank " : "ranks ") + waited_for));
    CHECK(waited[static_cast<std::size_t>(r)] >= timeout);  // its deadline, not an earlier failure
  }
  CHECK(timed_out >= 1);
}

TEST_CASE("NCCL: measured bytes are what the emulated NCCL brought into each rank's result, none on a real NCCL",
          "[comm][nccl][.gpu]") {
  if (!test::have_devices(1)) return;
  const int gpus = NcclCommunicator::device_count();
  // A real NCCL's transfers are invisible: bytes_moved stays 0 there.
  const bool emulated = &polyshard::emulation::take_nccl_traffic != nullptr;
  const int world = std::min(gpus, 3);
  for (const bool check_calls : {false, true}) {
    INFO("check_calls " << check_calls << ", " << world << " ranks, " << (emulated ? "emulated" : "real") << " NCCL");
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    REQUIRE_NOTHROW(run_ranks(world, [&](ThreadCommunicator& boot) {
      CommOptions options;
      options.timeout = 20s;
      options.check_calls = check_calls;
      NcclCommunicator comm = NcclCommunicator::bootstrap(boot, boot.rank(), options);
      const int r = comm.rank();
      const double N = world, n = 1021, T = sizeof(float);
      // The call check all-gathers 7 int64 and 256 bytes of the call site from every rank ahead
      // of each collective, counted under the collective it checks.
      const double check = check_calls && world > 1 ? (N - 1) * (7 * 8 + 256) : 0;
      std::string& error = errors[static_cast<std::size_t>(r)];
      const auto expect = [&](CollectiveKind kind, double before, double formula) {
        // Read through the const accessor, which must collect the traffic as the other does.
        const double got = std::as_const(comm).stats().bytes_moved(kind) - before;
        const double want = emulated ? formula + check : 0;
        if (got != want)
          error += std::string(collective_name(kind)) + ": moved " + std::to_string(got) + ", expected " +
                   std::to_string(want) + "; ";
      };
      DeviceBuffer<float> buf(1021), all(1021 * static_cast<std::size_t>(world));
      double before = comm.stats().bytes_moved(CollectiveKind::AllReduce);
      comm.all_reduce(buf.span());
      expect(CollectiveKind::AllReduce, before, (N - 1) * n * T);
      before = comm.stats().bytes_moved(CollectiveKind::ReduceScatter);
      comm.reduce_scatter(std::span<const float>(all.span()), buf.span());
      expect(CollectiveKind::ReduceScatter, before, (N - 1) * n * T);
      before = comm.stats().bytes_moved(CollectiveKind::AllGather);
      comm.all_gather(std::span<const float>(buf.span()), all.span());
      expect(CollectiveKind::AllGather, before, (N - 1) * n * T);
      before = comm.stats().bytes_moved(CollectiveKind::Broadcast);
      comm.broadcast(buf.span(), world - 1);
      expect(CollectiveKind::Broadcast, before, r == world - 1 ? 0 : n * T);
      before = comm.stats().bytes_moved(CollectiveKind::Reduce);
      comm.reduce(buf.span(), 0);
      expect(CollectiveKind::Reduce, before, r == 0 ? (N - 1) * n * T : 0);
      before = comm.stats().bytes_moved(CollectiveKind::Barrier);
      comm.barrier();
      expect(CollectiveKind::Barrier, before, (N - 1) * T);  // an all-reduce of one float
      // A collective only the device waits for, as the engine orders its gathers: once the
      // stream has finished, a read through the const accessor (the engine's hybrid groups are
      // read so) counts it, before any host wait on the handle.
      before = comm.stats().bytes_moved(CollectiveKind::AllGather);
      CommHandle gather = comm.all_gather_async<float>(std::span<const float>(buf.span()), all.span());
      gather.wait_on_device();
      if (cudaDeviceSynchronize() != cudaSuccess) test_comm::fail("cudaDeviceSynchronize");
      expect(CollectiveKind::AllGather, before, (N - 1) * n * T);
      gather.wait();
    }));
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r);
      CHECK(errors[static_cast<std::size_t>(r)] == "");
    }
  }
}
