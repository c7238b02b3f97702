// Generation through an engine: under sharded parameters every rank gathers the units for each
// token and all ranks draw one sequence, the one the whole model draws on one process; and a
// generation between training steps leaves the training exactly as it was.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"
#include "polyshard/engine/generate.hpp"

using namespace polyshard;
using namespace polyshard::test;

namespace {

const std::vector<std::int32_t> prompt = {3, 1, 4};
const SamplingConfig greedy{.new_tokens = 5, .temperature = 0.0};
const SamplingConfig sampled{.new_tokens = 5, .temperature = 1.0, .top_k = 6, .seed = 11};

struct GenerationRun {
  std::vector<std::vector<std::int32_t>> greedy, sampled;  // per rank
  Parameters before;                                       // the weights generation used
  Parameters parameters;                                   // after the last step
};

/// Trains tiny_gpt() under S on `world` thread ranks for two steps, generates (if asked) and
/// trains one step more.
template <class S>
GenerationRun train_and_generate(int world, bool generating) {
  GenerationRun run;
  run.greedy.resize(std::size_t(world));
  run.sampled.resize(std::size_t(world));
  std::vector<Parameters> parameters(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, momentum_sgd(), {}, 42);
    const BatchSampler sampler(tiny_data(), 8, 6, 7);
    const RowRange rows = rank_rows(6, comm.rank(), world);
    const double weight = double(rows.end - rows.begin) / 6.0;
    auto train_step = [&](int step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, weight);
      engine.step(0.1);
    };
    train_step(0);
    train_step(1);
    if (generating) {
      Parameters before = engine.full_parameters();
      if (comm.rank() == 0) run.before = std::move(before);
      run.greedy[std::size_t(comm.rank())] = generate(engine, model, prompt, greedy);
      run.sampled[std::size_t(comm.rank())] = generate(engine, model, prompt, sampled);
    }
    train_step(2);
    parameters[std::size_t(comm.rank())] = engine.full_parameters();
  });
  run.parameters = parameters[0];
  return run;
}

/// What the whole model with `parameters` generates on its own, without an engine.
std::vector<std::int32_t> generate_whole(const Parameters& parameters, const SamplingConfig& c) {
  Gpt<float> model(tiny_gpt());
  FlatParameters<float> flat(model);
  std::size_t found = 0;
  visit_parameters(model, [&](const std::string& name, Parameter<float>& p) {
    for (const auto& [n, values] : parameters)  // full_parameters() lists them by name
      if (n == name) {
        REQUIRE(values.size() == std::size_t(p.value().numel()));
        std::copy(values.begin(), values.end(), p.value().data());
        ++found;
      }
  });
  REQUIRE(found == parameters.size());
  return model.generate(prompt, c);
}

/// Generation after two steps under S at world sizes 1 to 3, on every rank, against the whole
/// model's with the same weights; and the third step's parameters against a run that did not
/// generate (bit for bit).
template <class S>
void check_generation() {
  for (const int world : {1, 2, 3}) {
    CAPTURE(world);
    const GenerationRun with = train_and_generate<S>(world, true);
    const GenerationRun without = train_and_generate<S>(world, false);
    const auto expected_greedy = generate_whole(with.before, greedy);
    const auto expected_sampled = generate_whole(with.before, sampled);
    for (int r = 0; r < world; ++r) {
      CHECK(with.greedy[std::size_t(r)] == expected_greedy);
      CHECK(with.sampled[std::size_t(r)] == expected_sampled);
    }
    CHECK(max_difference(with.parameters, without.parameters) == 0.0);
  }
}

}  // namespace

TEST_CASE("Generation under sharded parameters draws the whole model's tokens on every rank", "[engine][generate]") {
  SECTION("ZeRO-3 by block") { check_generation<FsdpPerBlock>(); }
  SECTION("ShardParameters<false> by block") { check_generation<GradOpPerBlock>(); }
  SECTION("ZeRO-3, every module of 1 parameter or more a unit") {
    check_generation<Strategy<ShardParameters<true>, WrapBySize<1>>>();
  }
  SECTION("DDP") { check_generation<DdpPerBlock>(); }
}
