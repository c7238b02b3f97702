// The engine's oracle under MPI: every process trains under a strategy on the MPI world and
// compares with a one-process DDP run it computes itself (ranks as threads, world size 1).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"
#include "polyshard/comm/mpi_communicator.hpp"

using namespace polyshard;

namespace {
// Created in main after MPI_Init and destroyed before MPI_Finalize.
MpiCommunicator* world_comm = nullptr;
MpiCommunicator& world() { return *world_comm; }

test::RunResult reference() {
  static const test::RunResult r = test::train<DDP>(1);
  return r;
}
}  // namespace

using Strategies = std::tuple<DDP, ZeRO<1>, ZeRO<2>, ZeRO<3>, Strategy<ShardParameters<true>, WrapByType<Block>>,
                              Strategy<ShardParameters<false>, WrapByType<Block>>>;

TEMPLATE_LIST_TEST_CASE("MPI: every strategy trains like one process", "[engine][mpi]", Strategies) {
  const auto result = test::train_rank<TestType>(world());
  CHECK(test::max_difference(result.parameters, reference().parameters) < 1e-6);
  const double expected = bytes_sent_per_step<TestType>(result.padded, result.root_padded, world().size());
  CHECK(result.bytes_sent == Approx(expected).epsilon(1e-12));
  CHECK(double(result.model_state) == Approx(model_state_bytes<TestType>(result.padded, world().size(), 1)));
}

TEST_CASE("MPI: the sharded stages agree with the in-process backend bit for bit", "[engine][mpi]") {
  // Both backends sum in the same fixed order, so the same world size gives the same bits.
  const int n = world().size();
  const auto threads = test::train<ZeRO<3>>(n);
  const auto mpi = test::train_rank<ZeRO<3>>(world());
  CHECK(test::max_difference(mpi.parameters, threads.parameters) == 0.0);
}

int main(int argc, char* argv[]) {
  MpiSession session(&argc, &argv);
  MpiCommunicator comm = MpiCommunicator::world();
  world_comm = &comm;
  Catch::Session catch_session;
  int rc = catch_session.applyCommandLine(argc, argv);
  if (rc == 0) rc = catch_session.run();
  world_comm = nullptr;
  return rc;
}
