// The worker pool of the host kernels: every part runs exactly once, errors come back to the
// caller, and callers from several threads at once (ranks stepping together) or from inside a
// job each get their work done.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "polyshard/core/cpu_workers.hpp"

using polyshard::detail::CpuWorkers;

TEST_CASE("every part runs once, more parts than threads included", "[core][cpu_workers]") {
  CpuWorkers pool(3);
  CHECK(pool.capacity() == 4);
  const unsigned parts = GENERATE(1u, 2u, 4u, 9u, 64u);
  for (int round = 0; round < 50; ++round) {  // the pool is reused: each round is a new generation
    std::vector<std::atomic<int>> runs(parts);
    pool.run(parts, [&](unsigned part) { runs[part].fetch_add(1); });
    for (unsigned p = 0; p < parts; ++p) REQUIRE(runs[p].load() == 1);
  }
}

TEST_CASE("a part that throws: the caller gets the error after every part has finished", "[core][cpu_workers]") {
  CpuWorkers pool(2);
  std::atomic<int> finished{0};
  CHECK_THROWS_WITH(pool.run(6,
                             [&](unsigned part) {
                               if (part == 4) throw std::runtime_error("part 4 failed");
                               finished.fetch_add(1);
                             }),
                    "part 4 failed");
  CHECK(finished.load() == 5);
  // The pool still works.
  std::atomic<int> count{0};
  pool.run(3, [&](unsigned) { count.fetch_add(1); });
  CHECK(count.load() == 3);
}

TEST_CASE("callers on several threads at once and jobs started inside jobs all complete", "[core][cpu_workers]") {
  CpuWorkers pool(2);
  constexpr int callers = 4, rounds = 100;
  std::vector<long> sums(callers, 0);
  {
    std::vector<std::jthread> threads;
    for (int c = 0; c < callers; ++c)
      threads.emplace_back([&pool, &sums, c] {
        for (int r = 0; r < rounds; ++r) {
          std::vector<long> part_sums(5, 0);
          pool.run(5, [&](unsigned part) {
            // A job inside a job: on the pool if it is free by then, else on this thread; either
            // way each part writes its own slot, as the kernels write their own ranges.
            std::array<long, 2> inner{};
            pool.run(2, [&](unsigned q) { inner[q] = q + 1; });
            part_sums[part] = part + inner[0] + inner[1];
          });
          sums[c] += std::accumulate(part_sums.begin(), part_sums.end(), 0L);
        }
      });
  }
  for (int c = 0; c < callers; ++c) CHECK(sums[c] == rounds * (0 + 1 + 2 + 3 + 4 + 5 * 3));
}

TEST_CASE("the process's pool has a worker per hardware thread beyond the caller's", "[core][cpu_workers]") {
  CHECK(polyshard::detail::cpu_workers().capacity() == std::max(1u, std::thread::hardware_concurrency()));
}
