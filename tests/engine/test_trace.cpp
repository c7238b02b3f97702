// The Chrome trace of a training step: compute spans on each rank's compute thread, gathers
// and reductions on communication threads, in a file chrome://tracing reads.
#include <catch2/catch.hpp>

#include <deque>
#include <fstream>
#include <sstream>

#include "engine_fixture.hpp"

using namespace polyshard;

TEST_CASE("a traced ZeRO-3 step records compute, gathers and reductions per rank", "[engine]") {
  std::deque<Trace> traces;
  for (int r = 0; r < 2; ++r) traces.emplace_back(r);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<Strategy<ShardParameters<true>, WrapByType<Block>>, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(
        model, comm, test::momentum_sgd(), {}, 42);
    engine.set_trace(&traces[static_cast<std::size_t>(comm.rank())]);
    BatchSampler sampler(test::tiny_data(), 8, 4, 7);
    const Batch b = sampler.batch(0, comm.rank(), 2);
    engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }), 0.5);
    engine.step(0.1);
  });
  const std::string path = "polyshard_test_trace.json";
  Trace::write_json(path, {&traces[0], &traces[1]});
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  std::remove(path.c_str());
  CHECK_THAT(json, Catch::StartsWith("{\"displayTimeUnit\": \"ms\", \"traceEvents\": ["));
  for (const char* name : {"\"forward\"", "\"backward\"", "\"step\"", "\"gather unit 1\"", "\"gather unit 2\"",
                           "\"reduce\"", "\"wait for reductions\"", "\"rank 1\"", "\"reduction of unit 2\""})
    CHECK_THAT(json, Catch::Contains(name));
  // Two blocks gathered twice (forward, backward), the root once: 5 gathers per rank, one of
  // them issued ahead (backward prefetches block 1 while block 2 computes).
  auto count = [&](const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = json.find(what); at != std::string::npos; at = json.find(what, at + 1)) ++n;
    return n;
  };
  CHECK(count("\"gather unit") + count("\"prefetch unit") == 10);
  CHECK(count("\"prefetch unit 1\"") == 2);
  CHECK(count("\"wait for prefetched unit 1\"") == 2);
}
