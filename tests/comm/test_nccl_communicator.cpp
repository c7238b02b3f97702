// Tests of the NCCL backend: it compiles and satisfies Communicator everywhere, reports a
// missing GPU cleanly, and (tag [.gpu]) runs every collective with one rank per visible GPU,
// bootstrapped over the in-process backend.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <iostream>
#include <tuple>
#include <vector>

#include "comm/collective_checks.hpp"
#include "polyshard/comm/nccl_communicator.hpp"
#include "polyshard/comm/thread_communicator.hpp"

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
  const int gpus = NcclCommunicator::device_count();
  if (gpus == 0) {
    WARN("no GPU visible (cudaGetDeviceCount failed or found none): the NCCL backend was not run");
    return;
  }
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
