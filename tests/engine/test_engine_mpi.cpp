// The engine's oracle under MPI: every process trains under a strategy on the MPI world and
// compares with a one-process DDP run it computes itself (ranks as threads, world size 1). And
// ranks that diverge inside the engine: every process stops with an error naming where.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>

#include "divergence.hpp"
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
  // The bytes this backend handed to MPI's sends, summed over the processes, against the ring
  // formula summed likewise plus the cross-rank check of each call, (N - 1) x call_check_bytes a
  // process (docs/communication.md).
  const int n = world().size();
  for (const CollectiveKind kind : {CollectiveKind::AllReduce, CollectiveKind::ReduceScatter,
                                    CollectiveKind::AllGather}) {
    INFO("collective kind " << static_cast<int>(kind));
    double sums[3] = {result.traffic.at(kind).first, result.traffic.at(kind).second,
                      double(result.calls.at(kind))};
    MPI_Allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const double check_bytes = default_check_calls() ? double(MpiCommunicator::call_check_bytes) : 0.0;
    CHECK(sums[0] == Approx(sums[1] + sums[2] * (n - 1) * check_bytes).margin(1e-9));
  }
}

TEST_CASE("MPI: the sharded stages agree with the in-process backend bit for bit", "[engine][mpi]") {
  // Both backends sum in the same fixed order, so the same world size gives the same bits.
  const int n = world().size();
  const auto threads = test::train<ZeRO<3>>(n);
  const auto mpi = test::train_rank<ZeRO<3>>(world());
  CHECK(test::max_difference(mpi.parameters, threads.parameters) == 0.0);
}

namespace {
/// Every process's `text`, by rank (over MPI_COMM_WORLD itself: the communicator the divergence
/// broke is not used again).
std::vector<std::string> gather_texts(const std::string& text) {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int length = static_cast<int>(text.size());
  std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int q = 0; q < size; ++q) {
    offsets[static_cast<std::size_t>(q)] = total;
    total += lengths[static_cast<std::size_t>(q)];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_Allgatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> texts;
  for (int q = 0; q < size; ++q)
    texts.push_back(all.substr(static_cast<std::size_t>(offsets[static_cast<std::size_t>(q)]),
                               static_cast<std::size_t>(lengths[static_cast<std::size_t>(q)])));
  return texts;
}

/// Runs test::diverge on a communicator of its own over the world (the last rank diverges) and
/// returns every process's error.
template <class S>
std::vector<std::string> errors_when(test::Divergence d) {
  CommOptions options;
  options.timeout = std::chrono::seconds(30);  // a missed mismatch fails instead of hanging
  std::string error;
  {
    MpiCommunicator comm(MPI_COMM_WORLD, options);
    error = test::diverge<S>(comm, d, comm.rank() == comm.size() - 1);
  }
  return gather_texts(error);
}
}  // namespace

TEMPLATE_TEST_CASE("MPI: ranks that diverge stop on every process with an error naming where", "[engine][mpi]",
                   test::DdpPerBlock, test::FsdpPerBlock) {
  for (const std::string& e : errors_when<TestType>(test::Divergence::SkipUnit)) {
    CAPTURE(e);
    CHECK_THAT(e, Catch::Contains("mismatched collectives (MPI)") && Catch::Contains("unit 'transformer.h.0'") &&
                      Catch::Contains("(step 2, micro-batch"));
  }
  for (const std::string& e : errors_when<TestType>(test::Divergence::FreezeParameter)) {
    CAPTURE(e);
    CHECK_THAT(e, Catch::Contains("mismatched collectives (MPI)") &&
                      Catch::Contains("with frozen parameters transformer.h.1.mlp.c_fc.weight (step 2, micro-batch 2)"));
  }
  for (const std::string& e : errors_when<TestType>(test::Divergence::ExtraMicroBatch)) {
    CAPTURE(e);
    CHECK_THAT(e, Catch::Contains("mismatched collectives (MPI)") &&
                      (Catch::Contains("(step 2, micro-batch 3)") || Catch::Contains("micro-batch 2, under no_sync)")));
  }
  for (const std::string& e : errors_when<TestType>(test::Divergence::None)) CHECK(e.empty());
}

// Run alone, one ctest entry per way of dying (POLYSHARD_TEST_DEATH = kill, exit or throw), under
// `mpirun --mca orte_abort_on_non_zero_status 0`, so that the launcher lets the survivors report.
// The last rank dies in step 2's backward with a gradient reduction and a prefetched gather in
// flight; every other rank must stop within its 3 s timeout with an error naming the collective
// and the rank it waited for, and exit non-zero (MpiSession aborts the job after a failed
// collective).
// One line in one write call: the launcher interleaves the ranks' output at write boundaries,
// and the expected line must reach ctest whole.
namespace {
void say(const std::string& text) {
  const std::string line = text + "\n";
  [[maybe_unused]] const auto written = ::write(STDERR_FILENO, line.data(), line.size());
}
}  // namespace

TEST_CASE("MPI: a rank that dies with work in flight (run alone: the job ends)", "[.mpi_rank_dies]") {
  const char* how_text = std::getenv("POLYSHARD_TEST_DEATH");
  const std::string how = how_text ? how_text : "kill";
  CommOptions options;
  options.timeout = std::chrono::seconds(3);
  MpiCommunicator comm(MPI_COMM_WORLD, options);
  Gpt<float> model(test::tiny_gpt());
  Engine<test::FsdpPerBlock, Gpt<float>, MpiCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
  BatchSampler sampler(test::tiny_data(), 8, 2 * comm.size(), 7);
  const bool dies = comm.rank() == comm.size() - 1;
  try {
    for (int step = 1; step <= 3; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), comm.size());
      const auto hook = [&] {
        if (!dies || step != 2) return;
        say("rank " + std::to_string(comm.rank()) + " dies (" + how + ")");
        if (how == "kill") std::raise(SIGKILL);
        if (how == "exit") std::_Exit(3);
        throw Error("rank " + std::to_string(comm.rank()) + " gave up in backward");
      };
      Var<float> loss = engine.forward([&] { return test::loss_with_backward_hook(model, b, hook); });
      engine.backward(loss, 1.0 / comm.size());
      engine.step(0.1);
    }
  } catch (const Error& e) {
    say("rank " + std::to_string(comm.rank()) + " stopped: " + e.what());
    if (dies) std::_Exit(4);  // a rank that threw ends as a program would, without MPI_Finalize
  }
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
