// AnyCommunicator against the backend it wraps: the same serial references as every backend
// (collective_checks.hpp), the same byte counters, sub-groups, async order and timeouts.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "collective_checks.hpp"
#include "polyshard/comm/any_communicator.hpp"
#include "polyshard/comm/thread_communicator.hpp"

using namespace polyshard;

namespace {
using Elements = std::tuple<float, double, polyshard::half, polyshard::bfloat16>;
}  // namespace

TEMPLATE_LIST_TEST_CASE("AnyCommunicator's collectives match the serial reference", "[comm][any]", Elements) {
  const int world = GENERATE(1, 2, 3, 5);
  CAPTURE(world);
  REQUIRE_NOTHROW(run_ranks(world, [](ThreadCommunicator& comm) {
    AnyCommunicator any = AnyCommunicator::borrow(comm);
    test_comm::check_collectives<AnyCommunicator, TestType>(any, 2);
  }));
}

TEST_CASE("AnyCommunicator's async collectives keep issue order, and its sub-groups split like MPI's", "[comm][any]") {
  const int world = GENERATE(1, 3, 4);
  CAPTURE(world);
  REQUIRE_NOTHROW(run_ranks(world, [](ThreadCommunicator& comm) {
    AnyCommunicator any = AnyCommunicator::borrow(comm);
    test_comm::check_async(any);
    test_comm::check_split(any);
  }));
}

TEST_CASE("AnyCommunicator counts in the wrapped backend's counters and keeps its timeout", "[comm][any][stats]") {
  run_ranks(2, [](ThreadCommunicator& comm) {
    AnyCommunicator any = AnyCommunicator::borrow(comm);
    std::vector<float> x(1000, 1.0f), out(500);
    any.all_reduce(std::span<float>(x));
    any.reduce_scatter_async(std::span<const float>(x), std::span<float>(out)).wait();
    // Ring formula at 2 ranks: all-reduce 2 (N-1)/N, reduce-scatter (N-1)/N of 4000 bytes.
    if (comm.stats().bytes_sent(CollectiveKind::AllReduce) != 4000.0 ||
        comm.stats().bytes_sent(CollectiveKind::ReduceScatter) != 2000.0 || &any.stats() != &comm.stats())
      test_comm::fail("rank ", comm.rank(), ": the wrapper's traffic is not the backend's");
    any.set_timeout(std::chrono::milliseconds(1234));
    if (comm.timeout() != std::chrono::milliseconds(1234)) test_comm::fail("set_timeout did not reach the backend");
    // An owning wrapper of a sub-group: rank 0 alone, then both together again.
    AnyCommunicator alone = any.split(comm.rank(), 0);
    if (alone.size() != 1 || alone.rank() != 0) test_comm::fail("split: got rank ", alone.rank(), " of ", alone.size());
    AnyCommunicator moved = std::move(alone);
    std::vector<double> y{double(comm.rank() + 1)};
    moved.all_reduce(std::span<double>(y));
    if (y[0] != double(comm.rank() + 1)) test_comm::fail("a one-rank all-reduce changed its value");
    any.all_reduce(std::span<double>(y));
    if (y[0] != 3.0) test_comm::fail("rank ", comm.rank(), ": the sum over both ranks is ", y[0]);
  });
}

TEST_CASE("a failure in the wrapped backend reaches AnyCommunicator's caller", "[comm][any][failure]") {
  CHECK_THROWS_WITH(run_ranks(2,
                              [](ThreadCommunicator& comm) {
                                AnyCommunicator any = AnyCommunicator::borrow(comm);
                                std::vector<float> x(comm.rank() == 0 ? 4 : 5);  // mismatched sizes
                                any.all_reduce(std::span<float>(x));
                              }),
                    Catch::Contains("mismatched"));
}
