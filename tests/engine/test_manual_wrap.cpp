// Manual wrapping: wrap(module) in a ShardedConstruction context makes the marked modules units,
// exactly as the automatic policies would cut the same modules, and refuses what it cannot do.
#include <catch2/catch.hpp>

#include <functional>
#include <thread>

#include "engine_fixture.hpp"
#include "support/error_of.hpp"
#include "polyshard/engine/sharded_construction.hpp"

using namespace polyshard;
using test::error_of;

namespace {

/// Marks modules of a freshly built model (or none).
using Marker = std::function<void(Gpt<float>&)>;

void mark_every_block(Gpt<float>& model) {
  for (auto& block : model.transformer.h) wrap(block);
}

/// What rank 0 saw of a run, and the unit layout of the engine (name, entry names and offsets).
struct Run {
  test::Parameters parameters;
  std::vector<double> losses;  // rank 0's weighted share of each step's loss
  std::vector<std::string> units;
};

std::string describe(const UnitLayout<float>& u) {
  std::string out = "'" + u.name + "' padded " + std::to_string(u.padded) + ":";
  for (const auto& e : u.entries) out += " " + e.name + "@" + std::to_string(e.offset);
  return out;
}

/// Trains tiny_gpt() under S for three steps on `world` thread ranks, each rank building its
/// model in its own ShardedConstruction context and marking it with `mark`.
template <class S>
Run train_marked(int world, const Marker& mark, int steps = 3) {
  std::vector<Run> runs(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Run& run = runs[static_cast<std::size_t>(comm.rank())];
    ShardedConstruction ctx;
    Gpt<float> model(test::tiny_gpt());
    mark(model);
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    for (const auto& u : engine.units().units) run.units.push_back(describe(u));
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    const RowRange rows = rank_rows(6, comm.rank(), world);
    const double weight = double(rows.end - rows.begin) / 6.0;
    for (int step = 0; step < steps; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      run.losses.push_back(loss.value().data()[0] * weight);
      engine.backward(loss, weight);
      engine.step(0.1);
    }
    run.parameters = engine.full_parameters();
  });
  return std::move(runs[0]);
}


/// Builds a ManualWrap engine on one rank from a model marked by `mark`, inside a context when
/// `with_context`; returns the error it threw ("" when none).
std::string build_error(const Marker& mark, bool with_context = true) {
  return error_of([&] {
    run_ranks(1, [&](ThreadCommunicator& comm) {
      std::optional<ShardedConstruction> ctx;
      if (with_context) ctx.emplace();
      Gpt<float> model(test::tiny_gpt());
      mark(model);
      Engine<Strategy<ShardParameters<true>, ManualWrap>, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(
          model, comm, test::momentum_sgd());
    });
  });
}

}  // namespace

using ManualStrategies = std::tuple<Strategy<ShardParameters<true>, ManualWrap>, Strategy<ShardParameters<false>, ManualWrap>,
                                    Strategy<ShardGradients, ManualWrap>, Strategy<NoShard, ManualWrap>>;

TEMPLATE_LIST_TEST_CASE("ManualWrap marking every Block cuts and trains as WrapByType<Block>, bit for bit", "[engine]",
                        ManualStrategies) {
  using ByType = with_t<TestType, WrapByType<Block>>;
  const int world = GENERATE(1, 2);
  CAPTURE(world);
  const Run manual = train_marked<TestType>(world, mark_every_block);
  const Run by_type = train_marked<ByType>(world, [](Gpt<float>&) {});
  REQUIRE(manual.units.size() == 1 + std::size_t(test::tiny_gpt().n_layer));
  CHECK(manual.units == by_type.units);
  CHECK(manual.losses == by_type.losses);
  CHECK(test::max_difference(manual.parameters, by_type.parameters) == 0.0);
  // And training moved the parameters.
  CHECK(test::max_difference(manual.parameters, train_marked<ByType>(world, [](Gpt<float>&) {}, 0).parameters) > 1e-3);
}

TEST_CASE("ManualWrap: marking only block 1 gives the root and that block, training equals one process", "[engine]") {
  using S = Strategy<ShardParameters<true>, ManualWrap>;
  const Marker block1 = [](Gpt<float>& model) { wrap(model.transformer.h[1]); };
  const Run run = train_marked<S>(2, block1);
  REQUIRE(run.units.size() == 2);
  CHECK(run.units[1].rfind("'transformer.h.1' ", 0) == 0);
  CHECK(run.units[0].find("transformer.h.0.attn.c_attn.weight") != std::string::npos);  // block 0 stays in the root
  CHECK(run.units[0].find("transformer.h.1.") == std::string::npos);
  CHECK(test::max_difference(run.parameters, test::train<DDP>(1).parameters) < 1e-6);
}

TEST_CASE("ManualWrap: nested marks and the order of marks", "[engine]") {
  using S = Strategy<ShardParameters<true>, ManualWrap>;
  // Units are numbered in declaration order whatever the order of marks; a unit inside a unit
  // takes its parameters out of the outer one.
  const Run run = train_marked<S>(2, [](Gpt<float>& model) {
    wrap(model.transformer.h[1]);
    wrap(model.transformer.h[0].mlp);
    wrap(model.transformer.h[0]);
    wrap(model.transformer.h[0]);  // twice is once
  });
  REQUIRE(run.units.size() == 4);
  CHECK(run.units[1].rfind("'transformer.h.0' ", 0) == 0);
  CHECK(run.units[1].find(".mlp.") == std::string::npos);
  CHECK(run.units[2].rfind("'transformer.h.0.mlp' ", 0) == 0);
  CHECK(run.units[3].rfind("'transformer.h.1' ", 0) == 0);
  CHECK(test::max_difference(run.parameters, test::train<DDP>(1).parameters) < 1e-6);
}

TEST_CASE("ManualWrap: what cannot be done is a clear error", "[engine]") {
  SECTION("wrap() outside a context") {
    Gpt<float> model(test::tiny_gpt());
    CHECK_THROWS_WITH(wrap(model.transformer.h[0]),
                      Catch::Contains("wrap(polyshard::Block<float>): no ShardedConstruction on this thread"));
  }
  SECTION("a ManualWrap engine outside a context") {
    CHECK_THAT(build_error([](Gpt<float>&) {}, false),
               Catch::Contains("ManualWrap: no ShardedConstruction on this thread"));
  }
  SECTION("a ManualWrap engine with no marks") {
    CHECK_THAT(build_error([](Gpt<float>&) {}), Catch::Contains("ManualWrap: no module was marked with wrap(module)"));
  }
  SECTION("a mark that is not a module of the model (another model's, or a module moved after wrap())") {
    CHECK_THAT(build_error([](Gpt<float>&) {
                 static Block<float> elsewhere(6, 2, 0.02);
                 wrap(elsewhere);
               }),
               Catch::Contains("polyshard::Block<float> at ") && Catch::Contains("which is not a module of this model"));
  }
  SECTION("a marked module with no parameters") {
    CHECK_THAT(build_error([](Gpt<float>& model) { wrap(model.transformer.h[0].mlp.gelu); }),
               Catch::Contains("wrap() marked 'transformer.h.0.mlp.gelu'") && Catch::Contains("holds no parameters"));
  }
  SECTION("a module that is not an ActivationModule does not compile (tests/fail/wrap_embedding.cpp)") {
    STATIC_REQUIRE(ActivationModule<Block<float>, float>);
    STATIC_REQUIRE_FALSE(ActivationModule<Embedding<float>, float>);
  }
}

TEST_CASE("ShardedConstruction: one per thread, nested scopes, ignored by the automatic policies", "[engine]") {
  REQUIRE(ShardedConstruction::current() == nullptr);
  {
    ShardedConstruction outer;
    CHECK(ShardedConstruction::current() == &outer);
    const ShardedConstruction* seen_by_other_thread = &outer;
    std::thread([&] { seen_by_other_thread = ShardedConstruction::current(); }).join();
    CHECK(seen_by_other_thread == nullptr);
    {
      ShardedConstruction inner;
      CHECK(ShardedConstruction::current() == &inner);
      Gpt<float> model(test::tiny_gpt());
      CHECK(&wrap(model.transformer.h[1]) == &model.transformer.h[1]);
      CHECK(inner.size() == 1);
      CHECK(outer.size() == 0);
      // A WrapWhole engine built in a context with marks ignores them.
      run_ranks(1, [&](ThreadCommunicator& comm) {
        ShardedConstruction in_rank;  // the rank's thread has its own context
        wrap(model.transformer.h[0]);
        Engine<DDP, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd());
        if (engine.units().units.size() != 1) throw Error("WrapWhole engine did not ignore the marks");
      });
    }
    CHECK(ShardedConstruction::current() == &outer);
  }
  CHECK(ShardedConstruction::current() == nullptr);
}

TEST_CASE("constructing a model allocates no parameter storage", "[engine]") {
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  Gpt<float> model({.vocab_size = 512, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 64});
  CHECK(tracker.peak_total() == 0);
  CHECK_FALSE(model.transformer.h[0].mlp.c_fc.weight.bound());
}

TEST_CASE("ManualWrap under ShardParameters: after construction a rank holds only its shards", "[engine]") {
  std::vector<std::int64_t> held(2), expected(2), parameter_peak(2), gradient_peak(2);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    const GptConfig config{.vocab_size = 512, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 64};
    // As in docs/strategies.md:
    ShardedConstruction ctx;
    Gpt<float> model(config);                             // allocates no parameter storage
    for (auto& block : model.transformer.h) wrap(block);  // each Block is a unit
    Engine<Strategy<ShardParameters<true>, ManualWrap>, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, {});
    // (end of the quote)
    const auto r = static_cast<std::size_t>(comm.rank());
    held[r] = tracker.current(MemoryCategory::Parameters);
    // Not even for a moment: a unit's whole buffers get memory only when it is gathered.
    parameter_peak[r] = tracker.peak(MemoryCategory::Parameters);
    gradient_peak[r] = tracker.peak(MemoryCategory::Gradients);
    expected[r] = engine.units().padded_total() / 2 * std::int64_t(sizeof(float));
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(held[r] == expected[r]);
    CHECK(parameter_peak[r] == expected[r]);
    CHECK(gradient_peak[r] == expected[r]);  // the reduced-gradient shards
  }
}
