// Tests of the MPI backend, run by ctest under mpirun with 2, 3 and 4 processes: the same checks
// as the in-process backend, bit-identity between the two, the mismatch report (calls are checked by default), and
// (hidden tags, run as their own ctest entries) a timeout and a dead rank ending the job.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <thread>
#include <tuple>

#include "comm/collective_checks.hpp"
#include "polyshard/comm/comm.hpp"
#include "polyshard/comm/mpi_communicator.hpp"

using namespace polyshard;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<MpiCommunicator> g_world;

MpiCommunicator& world() { return *g_world; }

using Elements = std::tuple<float, double, polyshard::half, polyshard::bfloat16>;

}  // namespace

TEMPLATE_LIST_TEST_CASE("MPI collectives match the serial reference", "[comm][mpi]", Elements) {
  REQUIRE_NOTHROW(test_comm::check_collectives<MpiCommunicator, TestType>(world(), 1));
}

TEST_CASE("MPI async collectives overlap and keep issue order", "[comm][mpi]") {
  REQUIRE_NOTHROW(test_comm::check_async(world()));
}

TEST_CASE("MPI sub-groups split like MPI_Comm_split", "[comm][mpi]") {
  REQUIRE_NOTHROW(test_comm::check_split(world()));
}

TEST_CASE("MPI and in-process backends agree bit for bit", "[comm][mpi]") {
  const int N = world().size();
  const int r = world().rank();
  const std::size_t n = 12345;
  auto x = test_comm::make_input<bfloat16>(r, n, 77);
  auto y = test_comm::make_input<float>(r, n, 78);
  world().all_reduce(std::span<bfloat16>(x), ReduceOp::Avg);
  world().all_reduce(std::span<float>(y));
  std::vector<bfloat16> tx;
  std::vector<float> ty;
  run_ranks(N, [&](ThreadCommunicator& comm) {
    auto a = test_comm::make_input<bfloat16>(comm.rank(), n, 77);
    auto b = test_comm::make_input<float>(comm.rank(), n, 78);
    comm.all_reduce(std::span<bfloat16>(a), ReduceOp::Avg);
    comm.all_reduce(std::span<float>(b));
    if (comm.rank() == r) {
      tx = a;
      ty = b;
    }
  });
  REQUIRE(std::memcmp(x.data(), tx.data(), n * sizeof(bfloat16)) == 0);
  REQUIRE(std::memcmp(y.data(), ty.data(), n * sizeof(float)) == 0);
}

TEMPLATE_TEST_CASE("MPI bytes moved are the bytes passed to its sends", "[comm][mpi][stats]", float,
                   polyshard::bfloat16) {
  using T = TestType;
  auto& comm = world();
  const int N = comm.size();
  const std::uint64_t n = 997, shard = n / std::uint64_t(N) + 1, whole = shard * std::uint64_t(N);
  std::vector<T> x(n, T(1.0f)), in(whole, T(1.0f)), out(shard);
  const auto moved_by_all = [&](CollectiveKind kind) {
    double mine = comm.stats().bytes_moved(kind);
    MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return mine;
  };
  comm.stats().reset();
  comm.all_reduce(std::span<T>(x));
  comm.reduce_scatter(std::span<const T>(in), std::span<T>(out));
  comm.all_gather(std::span<const T>(out), std::span<T>(in));
  comm.broadcast(std::span<T>(x), N - 1);
  comm.reduce(std::span<T>(x), 0);
  // docs/communication.md's formulas, summed over the ranks (n elements of T, each sent as T),
  // and each rank's 56-byte call check to each other rank when calls are checked (the default).
  const double t = sizeof(T);
  const double check = comm.check_calls() && N > 1 ? 56.0 * N * (N - 1) : 0.0;
  CHECK(moved_by_all(CollectiveKind::AllReduce) == 2.0 * double(N - 1) * double(n) * t + check);
  CHECK(moved_by_all(CollectiveKind::ReduceScatter) == double(N - 1) * double(whole) * t + check);
  CHECK(moved_by_all(CollectiveKind::AllGather) == double(N - 1) * double(whole) * t + check);
  CHECK(moved_by_all(CollectiveKind::Broadcast) == double(n) * t + check);
  CHECK(moved_by_all(CollectiveKind::Reduce) == double(N - 1) * double(n) * t + double(n - n / std::uint64_t(N)) * t + check);
}

TEST_CASE("MPI reports mismatched calls on every rank (checked by default)", "[comm][mpi][failure]") {
  CommOptions options;
  options.timeout = 20s;
  const int r = world().rank();
  {
    MpiCommunicator comm(MPI_COMM_WORLD, options);
    REQUIRE(comm.check_calls());
    std::vector<float> x(r == 0 ? 10 : 11, 1.0f);
    CHECK_THROWS_WITH(comm.all_reduce(std::span<float>(x)),
                      Catch::Contains("mismatched collectives") &&
                          Catch::Contains("rank 0 called all_reduce(F32, 10 elements, sum)") &&
                          Catch::Contains("rank 1 called all_reduce(F32, 11 elements, sum)"));
    // The ranks' queues no longer line up: later calls fail at once, naming the mismatch.
    std::vector<float> z(5, 1.0f);
    CHECK_THROWS_WITH(comm.all_reduce(std::span<float>(z)),
                      Catch::Contains("cannot run: an earlier call on this communicator did not match") &&
                          Catch::Contains("11 elements"));
  }
  {
    MpiCommunicator comm(MPI_COMM_WORLD, options);
    std::vector<double> y(4, 1.0);
    if (r == 0) CHECK_THROWS_WITH(comm.broadcast(std::span<double>(y), 0), Catch::Contains("broadcast(F64, 4 elements, root 0)"));
    else CHECK_THROWS_WITH(comm.reduce(std::span<double>(y), 0), Catch::Contains("reduce(F64, 4 elements, root 0, sum)"));
  }
  {
    // The same call from different call sites: each rank's site is named, the async form included.
    MpiCommunicator comm(MPI_COMM_WORLD, options);
    CallSite site(r == 0 ? "the first site" : "site number " + std::to_string(r));
    std::vector<float> w(3, 1.0f);
    CommHandle h = comm.all_reduce_async(std::span<float>(w));
    CHECK_THROWS_WITH(h.wait(), Catch::Contains("rank 0 called all_reduce(F32, 3 elements, sum) from the first site") &&
                                    Catch::Contains("rank 1 called all_reduce(F32, 3 elements, sum) from site number 1"));
  }
  // Nothing was sent: a new communicator over the same processes works.
  MpiCommunicator comm(MPI_COMM_WORLD, options);
  std::vector<float> z(5, 1.0f);
  comm.all_reduce(std::span<float>(z));
  CHECK(z[4] == static_cast<float>(comm.size()));
}

TEST_CASE("MPI timeout (run alone: the job aborts)", "[.mpi_timeout]") {
  auto& comm = world();
  comm.set_timeout(500ms);
  if (comm.rank() == 0) {
    // Never joins: it waits for a message nobody sends, until rank 1's abort ends this process.
    int never = 0;
    MPI_Recv(&never, 1, MPI_INT, 1, /*tag=*/4242, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return;
  }
  std::vector<float> x(16, 1.0f);
  try {
    comm.all_reduce(std::span<float>(x));
    FAIL("all_reduce returned although rank 0 never called it");
  } catch (const Error& e) {
    std::cerr << "caught: " << e.what() << std::endl;
    CHECK(MpiSession::failed());
  }
}

TEST_CASE("MPI rank death (run alone: the job ends)", "[.mpi_death]") {
  auto& comm = world();
  comm.set_timeout(60s);
  if (comm.rank() == 1) std::_Exit(3);  // dies without a word to MPI
  std::vector<float> x(16, 1.0f);
  comm.all_reduce(std::span<float>(x));
}

int main(int argc, char* argv[]) {
  MpiSession session(&argc, &argv);
  CommOptions options;
  options.timeout = 30s;  // a wrong test fails instead of hanging ctest
  g_world = std::make_unique<MpiCommunicator>(MpiCommunicator::world(options));
  Catch::Session catch_session;
  if (g_world->rank() != 0) catch_session.configData().showDurations = Catch::ShowDurations::Never;
  int failed = catch_session.run(argc, argv);
  // A failed collective leaves messages in flight: only aborting ends the job.
  if (MpiSession::failed()) MpiSession::abort("a collective failed (see above)");
  // Every rank ends with the same verdict.
  int any = failed != 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  g_world.reset();
  return any ? 1 : 0;
}
