// Tests of the in-process backend: every collective against the serial reference, determinism,
// async, sub-groups, byte counters, timeouts, failed ranks and mismatched calls.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/collective_checks.hpp"
#include "polyshard/comm/comm.hpp"
#include "polyshard/comm/host_values.hpp"

using namespace polyshard;
using namespace std::chrono_literals;

namespace {

CommOptions test_options(std::chrono::milliseconds timeout = 30s) {
  CommOptions o;
  o.timeout = timeout;
  return o;
}

/// Runs `body` on every rank and returns each rank's error message ("" when it did not throw).
template <class Body>
std::vector<std::string> errors_of(int world, Body body, CommOptions options) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  run_ranks(
      world,
      [&](ThreadCommunicator& comm) {
        try {
          body(comm);
        } catch (const Error& e) {
          errors[static_cast<std::size_t>(comm.rank())] = e.what();
        }
      },
      options);
  return errors;
}

using Elements = std::tuple<float, double, polyshard::half, polyshard::bfloat16>;

}  // namespace

TEMPLATE_LIST_TEST_CASE("in-process collectives match the serial reference", "[comm][thread]", Elements) {
  const int world = GENERATE(1, 2, 3, 4, 5);
  CAPTURE(world);
  REQUIRE_NOTHROW(run_ranks(world, [](ThreadCommunicator& comm) { test_comm::check_collectives<ThreadCommunicator, TestType>(comm, 1); },
                            test_options()));
}

TEST_CASE("in-process reductions are bit-identical across runs and interleavings", "[comm][thread]") {
  const int world = GENERATE(3, 4, 5);
  const std::size_t n = 10007;
  std::vector<std::vector<float>> first;
  std::vector<std::vector<bfloat16>> first_bf;
  for (int run = 0; run < 4; ++run) {
    std::vector<std::vector<float>> got(static_cast<std::size_t>(world));
    std::vector<std::vector<bfloat16>> got_bf(static_cast<std::size_t>(world));
    run_ranks(
        world,
        [&](ThreadCommunicator& comm) {
          // Different sleeps on every run and rank shuffle who arrives first at each step.
          std::mt19937 rng(static_cast<unsigned>(run * 31 + comm.rank()));
          auto x = test_comm::make_input<float>(comm.rank(), n, 5);
          auto y = test_comm::make_input<bfloat16>(comm.rank(), n, 6);
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
          comm.all_reduce(std::span<float>(x));
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
          comm.all_reduce(std::span<bfloat16>(y), ReduceOp::Avg);
          got[static_cast<std::size_t>(comm.rank())] = x;
          got_bf[static_cast<std::size_t>(comm.rank())] = y;
        },
        test_options());
    for (int r = 1; r < world; ++r) {
      REQUIRE(std::memcmp(got[r].data(), got[0].data(), n * sizeof(float)) == 0);
      REQUIRE(std::memcmp(got_bf[r].data(), got_bf[0].data(), n * sizeof(bfloat16)) == 0);
    }
    if (run == 0) {
      first = got;
      first_bf = got_bf;
    } else {
      REQUIRE(std::memcmp(got[0].data(), first[0].data(), n * sizeof(float)) == 0);
      REQUIRE(std::memcmp(got_bf[0].data(), first_bf[0].data(), n * sizeof(bfloat16)) == 0);
    }
  }
}

TEST_CASE("half and bfloat16 reductions accumulate in float", "[comm][thread]") {
  // 4 ranks add 256, then three times 0.5 (ring order for chunk 0 of a 1-element buffer starts
  // at rank 1): in bfloat16 every 256 + 0.5 rounds back to 256, in float the sum is 257.5, which
  // bfloat16 rounds to 258.
  run_ranks(4, [](ThreadCommunicator& comm) {
    std::vector<bfloat16> x{bfloat16(comm.rank() == 1 ? 256.0f : 0.5f)};
    comm.all_reduce(std::span<bfloat16>(x));
    if (static_cast<float>(x[0]) != 258.0f) test_comm::fail("bfloat16 sum: got ", static_cast<float>(x[0]));
  });
}

TEST_CASE("in-process async collectives overlap and keep issue order", "[comm][thread]") {
  const int world = GENERATE(1, 2, 3, 4, 5);
  CAPTURE(world);
  REQUIRE_NOTHROW(run_ranks(world, [](ThreadCommunicator& comm) { test_comm::check_async(comm); }, test_options()));
}

TEST_CASE("in-process sub-groups split like MPI_Comm_split", "[comm][thread]") {
  const int world = GENERATE(1, 2, 3, 4, 5);
  CAPTURE(world);
  REQUIRE_NOTHROW(run_ranks(world, [](ThreadCommunicator& comm) { test_comm::check_split(comm); }, test_options()));
}

TEST_CASE("byte counters follow the ring formula", "[comm][thread][stats]") {
  // Concrete figures, so that the formula itself is pinned: 4 ranks, 1000 floats (4000 bytes).
  run_ranks(4, [](ThreadCommunicator& comm) {
    std::vector<float> x(1000, 1.0f), out(250), big(4000);
    comm.all_reduce(std::span<float>(x));
    comm.all_reduce(std::span<float>(x));
    comm.reduce_scatter(std::span<const float>(x), std::span<float>(out));
    comm.all_gather(std::span<const float>(x), std::span<float>(big));
    comm.broadcast(std::span<float>(x), 0);
    comm.reduce(std::span<float>(x), 1);
    comm.barrier();
    const CommStats& s = comm.stats();
    const bool ok = s.bytes_sent(CollectiveKind::AllReduce) == 2 * 6000.0 && s.calls(CollectiveKind::AllReduce) == 2 &&
                    s.bytes_sent(CollectiveKind::ReduceScatter) == 3000.0 &&
                    s.bytes_sent(CollectiveKind::AllGather) == 12000.0 && s.bytes_sent(CollectiveKind::Broadcast) == 4000.0 &&
                    s.bytes_sent(CollectiveKind::Reduce) == 4000.0 && s.bytes_sent(CollectiveKind::Barrier) == 0.0 &&
                    s.calls(CollectiveKind::Barrier) == 1 && s.total_bytes_sent() == 35000.0;
    if (!ok) test_comm::fail("rank ", comm.rank(), ": counters do not match the formula");
    comm.stats().reset();
    if (comm.stats().total_bytes_sent() != 0 || comm.stats().calls(CollectiveKind::AllReduce) != 0)
      test_comm::fail("reset() did not zero the counters");
  });
  STATIC_REQUIRE(ring_bytes_sent(CollectiveKind::AllReduce, 3000, 3) == 4000.0);
  STATIC_REQUIRE(ring_bytes_sent(CollectiveKind::Broadcast, 3000, 1) == 0.0);
}

namespace {

/// Bytes moved by every rank together, per collective, as docs/communication.md gives the
/// in-process backend's formula (n elements of T, N ranks; the reduce's root 0): each rank reads
/// its chunk of every other rank's input, and an all-reduce then copies the other chunks.
struct InProcessTraffic {
  std::uint64_t n, t;
  int N;
  double all_reduce() const { return double(2 * (N - 1) * n * t); }
  double reduce_scatter() const { return double((N - 1) * n * t); }
  double all_gather() const { return double((N - 1) * n * t); }  // n: the output
  double broadcast() const { return double((N - 1) * n * t); }
  double reduce() const { return double((N - 1) * n * t + (n - n / std::uint64_t(N)) * t); }  // root 0's chunk: n / N
};

/// Runs one of each collective of `n` elements of T on `world` ranks and returns the bytes each
/// kind moved, summed over the ranks (measured), and the predicted ring bytes summed likewise.
template <class T>
std::map<CollectiveKind, std::pair<double, double>> measure_traffic(int world, std::uint64_t n) {
  std::vector<CommStats> seen(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    const std::uint64_t shard = n / std::uint64_t(world) + 1;  // reduce-scatter and all-gather need a multiple
    std::vector<T> x(n, T(1.0f)), in(shard * std::uint64_t(world), T(1.0f)), out(shard);
    comm.all_reduce(std::span<T>(x));
    comm.reduce_scatter(std::span<const T>(in), std::span<T>(out));
    comm.all_gather(std::span<const T>(out), std::span<T>(in));
    comm.broadcast(std::span<T>(x), 1 % world);
    comm.reduce(std::span<T>(x), 0);
    seen[static_cast<std::size_t>(comm.rank())] = comm.stats();
  }, test_options());
  std::map<CollectiveKind, std::pair<double, double>> total;
  for (const CommStats& s : seen)
    for (const CollectiveKind k : {CollectiveKind::AllReduce, CollectiveKind::ReduceScatter, CollectiveKind::AllGather,
                                   CollectiveKind::Broadcast, CollectiveKind::Reduce}) {
      total[k].first += s.bytes_moved(k);
      total[k].second += s.bytes_sent(k);
    }
  return total;
}

}  // namespace

TEMPLATE_TEST_CASE("bytes moved are measured as the in-process backend copies them", "[comm][thread][stats]", float,
                   double, polyshard::half, polyshard::bfloat16) {
  using T = TestType;
  for (const int world : {1, 2, 3, 4, 5}) {
    for (const std::uint64_t n : {std::uint64_t(1000), std::uint64_t(997)}) {  // 997 divides by none of 2..5
      INFO("world " << world << ", " << n << " elements");
      const auto got = measure_traffic<T>(world, n);
      const std::uint64_t shard = n / std::uint64_t(world) + 1, whole = shard * std::uint64_t(world);
      const InProcessTraffic f{n, sizeof(T), world};
      const InProcessTraffic scattered{whole, sizeof(T), world};
      if (world == 1) {
        for (const auto& [kind, bytes] : got) CHECK(bytes.first == 0.0);
        continue;
      }
      CHECK(got.at(CollectiveKind::AllReduce).first == f.all_reduce());
      CHECK(got.at(CollectiveKind::ReduceScatter).first == scattered.reduce_scatter());
      CHECK(got.at(CollectiveKind::AllGather).first == scattered.all_gather());
      CHECK(got.at(CollectiveKind::Broadcast).first == f.broadcast());
      CHECK(got.at(CollectiveKind::Reduce).first == f.reduce());
      // Against the ring formula's prediction: equal for the reductions (every element crosses
      // as T, once to be summed and, in an all-reduce, once more to be gathered), N copies
      // against N sends for a broadcast.
      const auto predicted = [&](CollectiveKind k) { return got.at(k).second; };
      CHECK(got.at(CollectiveKind::AllReduce).first == Approx(predicted(CollectiveKind::AllReduce)));
      CHECK(got.at(CollectiveKind::ReduceScatter).first == Approx(predicted(CollectiveKind::ReduceScatter)));
      CHECK(got.at(CollectiveKind::AllGather).first == Approx(predicted(CollectiveKind::AllGather)));
      CHECK(got.at(CollectiveKind::Broadcast).first == Approx(predicted(CollectiveKind::Broadcast) * (world - 1) / world));
    }
  }
}

TEST_CASE("a collective that times out fails on every waiting rank, naming who it waited for", "[comm][thread][failure]") {
  const auto start = std::chrono::steady_clock::now();
  const auto errors = errors_of(
      3,
      [](ThreadCommunicator& comm) {
        if (comm.rank() == 0) return;  // rank 0 never joins
        std::vector<float> x(8, 1.0f);
        comm.all_reduce(std::span<float>(x));
      },
      test_options(200ms));
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK(errors[0].empty());
  for (int r = 1; r < 3; ++r) {
    CAPTURE(r, errors[r]);
    CHECK_THAT(errors[r], Catch::Contains("all_reduce(F32, 8 elements, sum)"));
    CHECK_THAT(errors[r], Catch::Contains("on rank " + std::to_string(r) + " of 3"));
    CHECK_THAT(errors[r], Catch::Contains("timed out after 0.2 s waiting for rank"));
    CHECK_THAT(errors[r], Catch::Contains("rank 0 never entered this collective"));
  }
  CHECK_THAT(errors[1], Catch::Contains("waiting for rank 0"));
}

TEST_CASE("the timeout comes from POLYSHARD_COMM_TIMEOUT and can be set per communicator", "[comm][thread][failure]") {
  ::setenv("POLYSHARD_COMM_TIMEOUT", "0.25", 1);
  CHECK(default_comm_timeout() == 250ms);
  CHECK(CommOptions{}.timeout == 250ms);
  ::setenv("POLYSHARD_COMM_TIMEOUT", "soon", 1);
  CHECK_THROWS_WITH(default_comm_timeout(), Catch::Contains("POLYSHARD_COMM_TIMEOUT"));
  ::unsetenv("POLYSHARD_COMM_TIMEOUT");
  CHECK(default_comm_timeout() == 300s);

  std::vector<std::string> errors(2);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    // The split is a collective of its own: it runs under a timeout no load can reach, and the
    // short one is set only for the barrier that is meant to time out.
    comm.set_timeout(123s);
    auto sub = comm.split(0, comm.rank());
    if (sub.timeout() != 123s) test_comm::fail("split does not inherit the timeout");
    comm.set_timeout(100ms);
    if (comm.rank() == 1) return;
    try {
      comm.barrier();
    } catch (const Error& e) {
      errors[0] = e.what();
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("barrier() on rank 0 of 2 (in-process) timed out after 0.1 s waiting for rank 1"));
}

TEST_CASE("a rank that throws makes the others fail promptly, and run_ranks rethrows it", "[comm][thread][failure]") {
  std::vector<std::string> errors(3);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(run_ranks(
                        3,
                        [&](ThreadCommunicator& comm) {
                          if (comm.rank() == 1) throw std::runtime_error("rank 1 lost its data");
                          std::vector<double> x(100, 1.0);
                          try {
                            comm.all_reduce(std::span<double>(x));
                          } catch (const Error& e) {
                            errors[static_cast<std::size_t>(comm.rank())] = e.what();
                          }
                        },
                        test_options(5min)),
                    "rank 1 lost its data");
  CHECK(std::chrono::steady_clock::now() - start < 5s);  // not the five minutes of the timeout
  for (int r : {0, 2}) {
    CAPTURE(r, errors[r]);
    CHECK_THAT(errors[r], Catch::Contains("all_reduce(F64, 100 elements, sum) on rank " + std::to_string(r)));
    CHECK_THAT(errors[r], Catch::Contains("rank 1 failed: rank 1 lost its data"));
  }
}

TEST_CASE("mismatched calls are reported on every rank", "[comm][thread][failure]") {
  SECTION("different collectives") {
    const auto errors = errors_of(
        3,
        [](ThreadCommunicator& comm) {
          std::vector<float> x(10, 1.0f);
          if (comm.rank() == 2) comm.broadcast(std::span<float>(x), 0);
          else comm.all_reduce(std::span<float>(x));
        },
        test_options());
    for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("mismatched collectives"));
    const std::string all = errors[0] + errors[1] + errors[2];
    CHECK_THAT(all, Catch::Contains("broadcast(F32, 10 elements, root 0)"));
    CHECK_THAT(all, Catch::Contains("all_reduce(F32, 10 elements, sum)"));
  }
  SECTION("different sizes") {
    const auto errors = errors_of(
        2,
        [](ThreadCommunicator& comm) {
          std::vector<float> x(comm.rank() == 0 ? 10 : 12, 1.0f);
          comm.all_reduce(std::span<float>(x));
        },
        test_options());
    for (const auto& e : errors) {
      CHECK_THAT(e, Catch::Contains("mismatched collectives"));
      CHECK_THAT(e, Catch::Contains("10 elements"));
      CHECK_THAT(e, Catch::Contains("12 elements"));
    }
  }
  SECTION("different element types, operators and roots") {
    auto mixed = [](auto&& call_for_rank) {
      return errors_of(4, call_for_rank, test_options());
    };
    auto types = mixed([](ThreadCommunicator& comm) {
      if (comm.rank() == 3) {
        std::vector<double> x(6, 1.0);
        comm.all_reduce(std::span<double>(x));
      } else {
        std::vector<float> x(6, 1.0f);
        comm.all_reduce(std::span<float>(x));
      }
    });
    for (const auto& e : types) CHECK_THAT(e, Catch::Contains("mismatched collectives") && Catch::Contains("F64"));
    auto ops = mixed([](ThreadCommunicator& comm) {
      std::vector<polyshard::half> x(6, polyshard::half(1.0f));
      comm.all_reduce(std::span<polyshard::half>(x), comm.rank() == 0 ? ReduceOp::Avg : ReduceOp::Sum);
    });
    for (const auto& e : ops) CHECK_THAT(e, Catch::Contains("mismatched collectives") && Catch::Contains("avg"));
    auto roots = mixed([](ThreadCommunicator& comm) {
      std::vector<float> x(6, 1.0f);
      comm.reduce(std::span<float>(x), comm.rank() == 2 ? 1 : 0);
    });
    for (const auto& e : roots) CHECK_THAT(e, Catch::Contains("mismatched collectives") && Catch::Contains("root 1"));
  }
  SECTION("the same call from different call sites, issued asynchronously") {
    const auto errors = errors_of(
        3,
        [](ThreadCommunicator& comm) {
          CallSite site(comm.rank() == 1 ? "the odd one out" : "the common site");
          std::vector<float> x(4, 1.0f);
          comm.all_reduce_async(std::span<float>(x)).wait();
        },
        test_options());
    for (const auto& e : errors) {
      CHECK_THAT(e, Catch::Contains("mismatched collectives"));
      CHECK_THAT(e, Catch::Contains("all_reduce(F32, 4 elements, sum) from the odd one out"));
      CHECK_THAT(e, Catch::Contains("all_reduce(F32, 4 elements, sum) from the common site"));
    }
  }
}

TEST_CASE("call sites nest, and calls outside any site are compared by their arguments", "[comm][thread]") {
  CHECK(CallSite::current().empty());
  {
    CallSite outer("outer");
    CHECK(CallSite::current() == "outer");
    {
      CallSite inner("inner");
      CHECK(CallSite::current() == "inner");
    }
    CHECK(CallSite::current() == "outer");
  }
  CHECK(CallSite::current().empty());
  std::vector<float> sums(2);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    std::vector<float> x(3, 1.0f);
    comm.all_reduce(std::span<float>(x));
    sums[static_cast<std::size_t>(comm.rank())] = x[0];
  });
  CHECK(sums == std::vector<float>{2.0f, 2.0f});
}

TEST_CASE("invalid arguments are rejected before any rank waits", "[comm][thread]") {
  auto world = ThreadCommunicator::make_world(3);
  std::vector<float> in(10), out(3), x(4);
  CHECK_THROWS_WITH(world[0].reduce_scatter(std::span<const float>(in), std::span<float>(out)),
                    Catch::Contains("size() x the output = 3 x 3 = 9"));
  CHECK_THROWS_WITH(world[0].all_gather(std::span<const float>(out), std::span<float>(in)),
                    Catch::Contains("the output has 10 elements"));
  CHECK_THROWS_WITH(world[1].broadcast(std::span<float>(x), 3), Catch::Contains("root 3 is not a rank"));
  CHECK_THROWS_AS(ThreadCommunicator::make_world(0), Error);
}

TEST_CASE("the in-process backend allocates nothing: 16-bit sums run in blocks on the stack", "[comm][thread]") {
  std::vector<MemoryTracker> trackers(3);
  std::vector<std::vector<polyshard::half>> results(3);
  {
    run_ranks(3, [&](ThreadCommunicator& comm) {
      MemoryTracker& tracker = trackers[static_cast<std::size_t>(comm.rank())];
      comm.set_memory_tracker(tracker);  // where a backend's scratch would be counted
      TrackerScope scope(tracker);
      std::vector<polyshard::half> x(5000, polyshard::half(1.0f));  // more than one block of partial sums
      comm.all_reduce(std::span<polyshard::half>(x));
      std::vector<polyshard::half> in(6000, polyshard::half(0.5f)), out(in.size() / 3);
      comm.reduce_scatter(std::span<const polyshard::half>(in), std::span<polyshard::half>(out));
      results[static_cast<std::size_t>(comm.rank())] = x;
      results[static_cast<std::size_t>(comm.rank())].insert(results[static_cast<std::size_t>(comm.rank())].end(),
                                                            out.begin(), out.end());
    });
  }
  for (const auto& r : results) {
    REQUIRE(r.size() == 7000);
    CHECK(static_cast<float>(r.front()) == 3.0f);
    CHECK(static_cast<float>(r[4999]) == 3.0f);
    CHECK(static_cast<float>(r.back()) == 1.5f);
  }
  for (const MemoryTracker& tracker : trackers) CHECK(tracker.peak(MemoryCategory::Communication) == 0);
}

TEST_CASE("all_reduce_host, all_gather_host and broadcast_host move host values on a host communicator", "[comm]") {
  static_assert(!moves_device_buffers<ThreadCommunicator>);
  const int world = 3;
  struct Seen {
    std::vector<double> summed;
    float averaged = 0;
    std::vector<double> gathered;
    std::vector<float> broadcast;
  };
  std::vector<Seen> seen(world);
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Seen& mine_seen = seen[static_cast<std::size_t>(comm.rank())];
    mine_seen.summed = {double(comm.rank()), 1.5};
    all_reduce_host<Cpu>(comm, std::span<double>(mine_seen.summed));
    mine_seen.averaged = float(comm.rank()) * 2.0f;
    all_reduce_host<Cpu>(comm, std::span<float>(&mine_seen.averaged, 1), ReduceOp::Avg);
    const std::vector<double> mine{double(comm.rank()), -double(comm.rank())};
    mine_seen.gathered.resize(2 * world);
    all_gather_host<Cpu>(comm, std::span<const double>(mine), std::span<double>(mine_seen.gathered));
    mine_seen.broadcast = {float(comm.rank()), 7.0f};
    broadcast_host<Cpu>(comm, std::span<float>(mine_seen.broadcast), 2);
  }, test_options());
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    const Seen& s = seen[static_cast<std::size_t>(r)];
    CHECK(s.summed == std::vector<double>{0.0 + 1.0 + 2.0, 4.5});
    CHECK(s.averaged == 2.0f);
    CHECK(s.gathered == std::vector<double>{0, -0.0, 1, -1, 2, -2});
    CHECK(s.broadcast == std::vector<float>{2.0f, 7.0f});
  }
}

// Run alone by CTest (test_comm:assertion-from-a-rank-thread-stops): the suite's listener stops
// the program at an assertion made on a rank thread, naming it.
TEST_CASE("an assertion from a rank thread stops the program", "[.assertion_from_rank_thread]") {
  run_ranks(2, [](ThreadCommunicator& comm) { CHECK(comm.size() == 2); });
}
