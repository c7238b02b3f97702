// Ranks that diverge inside the engine stop at the first collective that differs, every rank
// with an error naming the unit, the parameter or the micro-batch: never a hang, never weights
// that drift apart in silence; and a rank that fails with collectives in flight stops the others,
// naming it. (Under MPI: test_engine_mpi.cpp runs the same cases.)
#include <catch2/catch.hpp>

#include "divergence.hpp"

using namespace polyshard;
using namespace std::chrono_literals;

namespace {

/// Runs `diverge` on `world` thread ranks (the last rank diverges) and returns every rank's
/// error ("" for a rank that finished), collected for the test thread to check.
template <class S>
std::vector<std::string> errors_when(int world, test::Divergence d) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  CommOptions options;
  options.timeout = 30s;  // a missed mismatch fails the test instead of hanging it
  run_ranks(
      world,
      [&](ThreadCommunicator& comm) {
        errors[static_cast<std::size_t>(comm.rank())] = test::diverge<S>(comm, d, comm.rank() == world - 1);
      },
      options);
  return errors;
}

using Strategies = std::tuple<test::DdpPerBlock, test::ZeRO2PerBlock, test::FsdpPerBlock, ZeRO<1>>;

}  // namespace

TEMPLATE_LIST_TEST_CASE("a rank that skips a unit's forward stops every rank, naming the unit", "[engine][divergence]",
                        Strategies) {
  for (const int world : {2, 3}) {
    CAPTURE(world);
    const auto errors = errors_when<TestType>(world, test::Divergence::SkipUnit);
    for (const std::string& e : errors) {
      CAPTURE(e);
      CHECK_THAT(e, Catch::Contains("mismatched collectives"));
      // Where block 0 is a unit its gather or reduction is missing; where it is not, the
      // reduction of the unit holding it names its parameters as without a gradient.
      CHECK_THAT(e, Catch::Contains("unit 'transformer.h.0'") || Catch::Contains("no gradient for transformer.h.0."));
      CHECK_THAT(e, Catch::Contains("(step 2, micro-batch"));
    }
  }
}

TEMPLATE_LIST_TEST_CASE("a rank that freezes a parameter the others train stops every rank, naming the parameter",
                        "[engine][divergence]", Strategies) {
  const auto errors = errors_when<TestType>(3, test::Divergence::FreezeParameter);
  for (const std::string& e : errors) {
    CAPTURE(e);
    CHECK_THAT(e, Catch::Contains("mismatched collectives"));
    CHECK_THAT(e, Catch::Contains("with frozen parameters transformer.h.1.mlp.c_fc.weight (step 2, micro-batch 2)"));
  }
}

TEMPLATE_LIST_TEST_CASE("a rank with an extra micro-batch stops every rank, naming the micro-batch",
                        "[engine][divergence]", Strategies) {
  const auto errors = errors_when<TestType>(2, test::Divergence::ExtraMicroBatch);
  for (const std::string& e : errors) {
    CAPTURE(e);
    CHECK_THAT(e, Catch::Contains("mismatched collectives"));
    // A reduction of micro-batch 3 against one of micro-batch 2, or (where forward gathers) the
    // extra micro-batch's gathers under no_sync against the others' synchronised micro-batch.
    CHECK_THAT(e, (Catch::Contains("(step 2, micro-batch 3)") && Catch::Contains("(step 2, micro-batch 2)")) ||
                      (Catch::Contains("(step 2, micro-batch 2, under no_sync)") &&
                       Catch::Contains("(step 2, micro-batch 2)")));
  }
}

TEST_CASE("ranks that agree train through the checks", "[engine][divergence]") {
  const auto errors = errors_when<test::FsdpPerBlock>(3, test::Divergence::None);
  for (const std::string& e : errors) CHECK(e.empty());
}

TEST_CASE("a rank that throws with a reduction and a prefetched gather in flight stops every other rank, naming it",
          "[engine][divergence]") {
  constexpr int world = 3;
  std::vector<std::string> errors(world);
  CommOptions options;
  options.timeout = 30s;
  const auto body = [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<test::FsdpPerBlock, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(),
                                                                                  {}, 42);
    BatchSampler sampler(test::tiny_data(), 8, 2 * world, 7);
    const bool dies = comm.rank() == world - 1;
    try {
      for (int step = 1; step <= 3; ++step) {
        const Batch b = sampler.batch(step, comm.rank(), world);
        const auto hook = [&] {
          if (dies && step == 2) throw Error("rank 2 gave up in backward");
        };
        Var<float> loss = engine.forward([&] { return test::loss_with_backward_hook(model, b, hook); });
        engine.backward(loss, 1.0 / world);
        engine.step(0.1);
      }
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
      if (dies) throw;  // run_ranks fails the group, as a rank's program that throws ends
    }
  };
  CHECK_THROWS_WITH(run_ranks(world, body, options), "rank 2 gave up in backward");
  for (int r = 0; r + 1 < world; ++r) {
    const std::string& e = errors[static_cast<std::size_t>(r)];
    CAPTURE(r, e);
    CHECK_THAT(e, Catch::Contains(" from the ") && Catch::Contains("(step 2, micro-batch 1)"));
    // "... failed while waiting for rank N: rank 2 failed: ..." in a collective under way, or
    // "... cannot run: rank 2 failed: ..." in one that starts after the group failed.
    CHECK_THAT(e, Catch::Contains("on rank " + std::to_string(r) + " of 3 (in-process)"));
    CHECK_THAT(e, Catch::Contains("rank 2 failed: rank 2 gave up in backward"));
  }
}
