// OptimizerList, FairScale's list of OSS: several optimizers in one engine, each over the
// parameters it selects, each with its own class and hyperparameters, learning rate scaled with
// the first's, and under whole_parameters its own partition; against a one-process oracle on flat
// buffers (optimizer_list_oracle.hpp), under every sharding, through a checkpoint onto another
// world size.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine_fixture.hpp"
#include "io/temp_dir.hpp"
#include "optimizer_list_oracle.hpp"
#include "polyshard/io/sharded_checkpoint.hpp"
#include "polyshard/optim/optimizer_list.hpp"

using namespace polyshard;
using test::max_difference;

namespace {

using test::first_lr;
using test::List;
using test::list_oracle;
using test::sgd_and_adam;
using Opt = AnyOptimizer<float>;

/// What rank 0 saw: the parameters at the end, the engine's state kinds and its layout.
struct ListRun {
  test::Parameters parameters;
  std::vector<std::string> state_names;
  std::map<std::string, std::pair<std::size_t, std::int64_t>> placed;  // name: (unit, offset)
  std::vector<std::vector<std::int64_t>> bounds;                        // per unit
};

/// tiny_gpt() trained under S for steps [from, to) on `world` thread ranks with `list`, step(lr)
/// at first_lr; loaded from `load` first and saved to `save` at the end where given.
template <class S>
ListRun train_list(int world, const List& list, int from, int to, const std::filesystem::path& load = {},
                   const std::filesystem::path& save = {}) {
  ListRun out;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Opt> engine(model, comm, list, {}, 42);
    if (!load.empty()) load_checkpoint(engine, load);
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    const RowRange rows = rank_rows(6, comm.rank(), world);
    for (int step = from; step < to; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, double(rows.end - rows.begin) / 6.0);
      engine.step(first_lr);
    }
    if (!save.empty()) save_checkpoint(engine, save);
    auto parameters = engine.full_parameters();
    if (comm.rank() != 0) return;
    out.parameters = std::move(parameters);
    out.state_names = engine.optimizers().at(0).state_names();
    const auto& units = engine.units().units;
    for (std::size_t u = 0; u < units.size(); ++u) {
      out.bounds.push_back(units[u].bounds);
      for (const auto& e : units[u].entries) out.placed[e.name] = {u, e.offset};
    }
  });
  return out;
}

constexpr int steps = 3;

}  // namespace

TEST_CASE("an OptimizerList steps each parameter with the first optimizer that selects it, as the oracle does",
          "[engine][optim]") {
  const List list = sgd_and_adam();
  const auto reference = list_oracle(list, steps);
  // The list matters: the oracle with Adam alone, or SGD alone, is another training.
  CHECK(max_difference(reference, list_oracle({list[1]}, steps)) > 1e-4);
  CHECK(max_difference(reference, list_oracle({{every_parameter(), list[0].config}}, steps)) > 1e-4);
  const auto one = train_list<DDP>(1, list, 0, steps);
  CHECK(max_difference(one.parameters, reference) < 1e-6);
  // Every state kind of every optimizer, in the list's order, whatever a span's own groups keep.
  CHECK(one.state_names == std::vector<std::string>{"momentum_buffer", "exp_avg", "exp_avg_sq"});
}

TEMPLATE_TEST_CASE("an OptimizerList trains as one process under every sharding", "[engine][optim]", DDP, ZeRO<1>,
                   ZeRO<2>, ZeRO<3>, test::FsdpPerBlock, ShardedDDP) {
  const List list = sgd_and_adam();
  const auto reference = list_oracle(list, steps);
  for (const int world : {2, 3}) {
    CAPTURE(world);
    CHECK(max_difference(train_list<TestType>(world, list, 0, steps).parameters, reference) < 1e-6);
  }
}

TEST_CASE("an OptimizerList's learning rates scale with the first's, each by its configured ratio",
          "[engine][optim]") {
  // Plain SGD, one step: each parameter moves by its own lr times the gradient, which two runs of
  // one optimizer each give bit for bit (configured 1/8 and 1/32: step(1/16) is 1/16 and 1/64).
  const List list{{names_starting_with({"transformer.h.0.", "transformer.wpe."}), SgdConfig{.lr = 1.0 / 8}},
                  {every_parameter(), SgdConfig{.lr = 1.0 / 32}}};
  const auto run = [](const List& l, double lr) {
    test::Parameters out;
    run_ranks(2, [&](ThreadCommunicator& comm) {
      Gpt<float> model(test::tiny_gpt());
      Engine<ZeRO<2>, Gpt<float>, ThreadCommunicator, Opt> engine(model, comm, l, {}, 42);
      BatchSampler sampler(test::tiny_data(), 8, 6, 7);
      const Batch b = sampler.batch(0, comm.rank(), 2);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, 0.5);
      engine.step(lr);
      auto p = engine.full_parameters();
      if (comm.rank() == 0) out = std::move(p);
    });
    return out;
  };
  const auto listed = run(list, 1.0 / 16);
  const auto fast = run({{every_parameter(), SgdConfig{}}}, 1.0 / 16);
  const auto slow = run({{every_parameter(), SgdConfig{}}}, 1.0 / 64);
  std::size_t first = 0, second = 0;
  for (std::size_t i = 0; i < listed.size(); ++i) {
    const std::string& name = listed[i].first;
    CAPTURE(name);
    const bool in_first = name.starts_with("transformer.h.0.") || name.starts_with("transformer.wpe.");
    CHECK(listed[i].second == (in_first ? fast : slow)[i].second);
    ++(in_first ? first : second);
  }
  CHECK(first > 0);
  CHECK(second > 0);
  CHECK(max_difference(fast, slow) > 1e-5);
}

TEST_CASE("under whole_parameters each optimizer of a list partitions its own parameters, with a tally of its own",
          "[engine][optim][partition]") {
  const List list = sgd_and_adam();
  bool one_tally_differs = false;
  for (const int world : {2, 3}) {
    CAPTURE(world);
    const ListRun run = train_list<ShardedDDP>(world, list, 0, 0);
    REQUIRE(run.bounds.size() == 1);  // one unit
    const std::vector<std::int64_t>& bounds = run.bounds[0];
    REQUIRE(bounds.size() == static_cast<std::size_t>(world) + 1);
    // Two tallies kept here, in the order the model's visitor walks it: SGD's (the second
    // block's parameters) and Adam's (the rest), each rank's parameters laid out in that order.
    Gpt<float> model(test::tiny_gpt());
    const auto ranks = static_cast<std::size_t>(world);
    std::vector<std::vector<std::int64_t>> load(2, std::vector<std::int64_t>(ranks, 0));
    std::vector<std::int64_t> one_tally(ranks, 0);
    std::vector<std::vector<std::pair<std::string, std::int64_t>>> owned(ranks);  // each rank's, in order
    const auto least = [](const std::vector<std::int64_t>& tally) {
      return static_cast<std::size_t>(std::min_element(tally.begin(), tally.end()) - tally.begin());
    };
    visit_parameters(model, [&](const std::string& name, Parameter<float>& p) {
      auto& tally = load[name.starts_with("transformer.h.1.") ? 0 : 1];
      const std::size_t owner = least(tally);
      tally[owner] += p.numel();
      owned[owner].emplace_back(name, p.numel());
      const std::size_t shared = least(one_tally);
      one_tally[shared] += p.numel();
      one_tally_differs = one_tally_differs || shared != owner;
    });
    for (std::size_t r = 0; r < owned.size(); ++r) {
      std::int64_t at = bounds[r];
      for (const auto& [name, numel] : owned[r]) {
        CAPTURE(name);
        CHECK(run.placed.at(name).second == at);
        at += numel;
      }
      CHECK(at == bounds[r + 1]);
    }
  }
  CHECK(one_tally_differs);  // which the layout checked above would not have matched
}

TEST_CASE("an OptimizerList's state goes through a checkpoint onto another world size and partition",
          "[engine][optim][checkpoint]") {
  const List list = sgd_and_adam();
  const auto reference = list_oracle(list, steps + 2);
  test::TempDir dir;
  train_list<ShardedDDP>(3, list, 0, steps, {}, dir.path() / "ckpt");
  // Each parameter's pieces hold the kinds its own optimizer keeps, and no others (which would be
  // zeros): the SGD block its momentum buffers, the rest Adam's moments.
  std::map<std::string, int> pieces;  // per kind, of the SGD block and of the rest
  for (const auto& file : std::filesystem::directory_iterator(dir.path() / "ckpt"))
    if (file.path().filename().string().starts_with("rank-")) {
      const auto rank_file = SafetensorsFile::open(file.path());  // outlives the loop over its tensors
      for (const auto& t : rank_file.tensors()) {
        const std::size_t slash = t.name.find('/');
        const bool sgd = t.name.substr(slash + 1).starts_with("transformer.h.1.");
        ++pieces[t.name.substr(0, slash) + (sgd ? " sgd" : " adam")];
      }
    }
  CHECK(pieces["master sgd"] > 0);
  CHECK(pieces["master adam"] > 0);
  CHECK(pieces["momentum_buffer sgd"] == pieces["master sgd"]);
  CHECK(pieces["exp_avg adam"] == pieces["master adam"]);
  CHECK(pieces["exp_avg_sq adam"] == pieces["master adam"]);
  CHECK(pieces.size() == 5);  // no momentum_buffer of Adam's parameters, no moments of SGD's
  // Loaded onto two ranks under ZeRO-2's flat slices: the momentum buffers and moments resume.
  const auto resumed = train_list<ZeRO<2>>(2, list, steps, steps + 2, dir.path() / "ckpt");
  CHECK(max_difference(resumed.parameters, reference) < 1e-6);
  // The same kinds in all, another optimizer for some parameters: the checkpoint names them, and
  // the load refuses rather than resume Adam from SGD's state (or SGD from zeros).
  const List swapped{{names_starting_with({"transformer.h.1."}), list[1].config}, {every_parameter(), list[0].config}};
  CHECK_THROWS_WITH(train_list<ZeRO<2>>(2, swapped, steps, steps + 1, dir.path() / "ckpt"),
                    Catch::Contains("keep other state than the checkpoint's for 'transformer.wte.weight (saved with "
                                    "exp_avg exp_avg_sq, now momentum_buffer)'") &&
                        Catch::Contains("and 20 more") &&
                        Catch::Contains("load it with the OptimizerList it was saved with"));
  // A checkpoint of Adam alone does not load into the list, which keeps another set of kinds:
  // the engine-wide check names them.
  train_list<ZeRO<2>>(1, {list[1]}, 0, 1, {}, dir.path() / "adam");
  CHECK_THROWS_WITH(train_list<ZeRO<2>>(1, list, 1, 2, dir.path() / "adam"),
                    Catch::Contains("holds optimizer state 'exp_avg', 'exp_avg_sq' but the engine's optimizer keeps"));
}

TEST_CASE("an OptimizerList that leaves a parameter out, or is empty, is refused naming it", "[engine][optim]") {
  const auto build = [](const List& list) {
    run_ranks(1, [&](ThreadCommunicator& comm) {
      Gpt<float> model(test::tiny_gpt());
      Engine<ZeRO<2>, Gpt<float>, ThreadCommunicator, Opt> engine(model, comm, list, {}, 42);
    });
  };
  const ParameterSelector all_but_one = [](std::string_view name) { return name != "transformer.ln_f.bias"; };
  CHECK_THROWS_WITH(build({{all_but_one, AdamConfig{}}}),
                    Catch::Contains("no optimizer of the OptimizerList selects parameter 'transformer.ln_f.bias'"));
  CHECK_THROWS_WITH(build({}), Catch::Contains("an OptimizerList of no optimizers"));
  CHECK_THROWS_WITH(build({{all_but_one, SgdConfig{.lr = 0}}, {every_parameter(), SgdConfig{}}}),
                    Catch::Contains("first optimizer has lr 0, and optimizer 1's is not"));
  CHECK_NOTHROW(build({{all_but_one, AdamConfig{}}, {every_parameter(), SgdConfig{}}}));
}
