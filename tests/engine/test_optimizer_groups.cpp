// OptimizerGroups (sub_group_size): a span stepped in sub-groups, each with state of its own, and
// OptimizerGroupsView, the groups seen as one optimizer over the span.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "engine_fixture.hpp"
#include "polyshard/engine/optimizer_groups.hpp"

using namespace polyshard;

namespace {

/// n deterministic values in about [-1, 1), a different stream per seed.
std::vector<float> values(std::size_t n, std::uint64_t seed) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(static_cast<double>(splitmix64(seed * 1'000'003 + i) % 2'000'001) / 1e6 - 1.0);
  return out;
}

bool same_bits(const std::vector<float>& a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("OptimizerGroups steps a span in sub-groups to the bits of one optimizer over it", "[engine][optim]") {
  const std::size_t n = 101;
  const AdamWConfig config{.lr = 1e-2, .weight_decay = 0.1};
  OptimizerGroups<AdamW<float>> groups(config, n, 30);
  REQUIRE(groups.size() == 4);
  CHECK(groups.offset(0) == 0);
  CHECK(groups.offset(3) == 90);
  CHECK(groups.numel(0) == 30);
  CHECK(groups.numel(3) == 11);
  CHECK(groups.numel() == n);
  CHECK(groups.state_names() == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  CHECK(groups.state_bytes() == 2 * n * sizeof(float));

  AdamW<float> whole(config, n);
  std::vector<float> by_groups = values(n, 1), by_whole = by_groups;
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> grads = values(n, 10 + static_cast<std::uint64_t>(step));
    const double lr = 1e-2 / step;  // a schedule: every group follows it
    groups.set_lr(lr);
    whole.set_lr(lr);
    for (std::size_t k = 0; k < groups.size(); ++k) {
      const auto at = static_cast<std::size_t>(groups.offset(k)), len = static_cast<std::size_t>(groups.numel(k));
      groups[k].step(std::span<float>(by_groups).subspan(at, len), std::span<const float>(grads).subspan(at, len), 0.5);
    }
    whole.step(std::span<float>(by_whole), std::span<const float>(grads), 0.5);
  }
  CHECK(groups.step_count() == 3);
  CHECK(groups.lr() == Approx(1e-2 / 3));
  CHECK(same_bits(by_whole, by_groups));
  OptimizerGroupsView<AdamW<float>> view(groups);
  REQUIRE(view.state().size() == 2);
  for (std::size_t s = 0; s < 2; ++s) {
    const auto mine = view.state()[s].second.to_vector();
    CHECK(same_bits(mine, whole.state()[s].second.span()));
  }
}

TEST_CASE("OptimizerGroupsView writes what it was given back into the groups", "[engine][optim]") {
  const SgdConfig config{.lr = 0.1, .momentum = 0.9};
  SECTION("several groups: copies, written back on request") {
    OptimizerGroups<Sgd<float>> groups(config, 10, 4);
    OptimizerGroupsView<Sgd<float>> view(groups);
    REQUIRE(view.state().size() == 1);
    const Tensor<float> momentum = view.state()[0].second;
    REQUIRE(momentum.numel() == 10);
    for (std::int64_t i = 0; i < 10; ++i) momentum.data()[i] = static_cast<float>(i);
    CHECK(groups[2].state()[0].second.data()[1] == 0.0f);  // not yet
    view.write_back();
    CHECK(groups[0].state()[0].second.data()[3] == 3.0f);
    CHECK(groups[1].state()[0].second.data()[0] == 4.0f);
    CHECK(groups[2].state()[0].second.data()[1] == 9.0f);
    view.set_step_count(7);
    for (const auto& g : groups) CHECK(g.step_count() == 7);
  }
  SECTION("one group: its own tensors") {
    OptimizerGroups<Sgd<float>> groups(config, 10, 1'000);
    REQUIRE(groups.size() == 1);
    OptimizerGroupsView<Sgd<float>> view(groups);
    view.state()[0].second.data()[5] = 2.5f;
    CHECK(groups[0].state()[0].second.data()[5] == 2.5f);
  }
}

TEST_CASE("OptimizerGroups can hold the master weights, and the view puts them together again", "[engine][optim]") {
  OptimizerGroups<Sgd<float>> groups(SgdConfig{.lr = 0.1}, 10, 4);
  const Tensor<float> master = Tensor<float>::empty({10}, MemoryCategory::OptimizerState);
  for (std::int64_t i = 0; i < 10; ++i) master.data()[i] = static_cast<float>(i);
  CHECK_FALSE(groups.hold_masters());
  CHECK(groups.params(2, master).data() == master.data() + 8);  // the span's slice
  groups.hold_masters_apart(master);
  REQUIRE(groups.hold_masters());
  CHECK_FALSE(master.storage()->materialized());  // the groups hold the elements now
  CHECK(groups.master(1).to_vector() == std::vector<float>{4, 5, 6, 7});
  CHECK(groups.params(2, master).data() == groups.master(2).data());
  {
    OptimizerGroupsView<Sgd<float>> view(groups, master);
    REQUIRE(master.storage()->materialized());
    CHECK(master.to_vector() == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    master.data()[9] = -1.0f;
    view.write_back();
  }
  CHECK_FALSE(master.storage()->materialized());  // given back with the view
  CHECK(groups.master(2).to_vector() == std::vector<float>{8, -1});
}

TEST_CASE("the engine cuts each unit's optimizer span into sub_group_size pieces", "[engine]") {
  StrategyConfig config;
  config.sub_group_size = 37;
  std::vector<std::vector<std::size_t>> counts(3);
  run_ranks(3, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<test::FsdpPerBlock, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(),
                                                                                  config, 42);
    for (std::size_t u = 0; u < engine.optimizers().size(); ++u) {
      const auto& groups = engine.optimizers()[u];
      const std::int64_t span = engine.unit_states()[u].shard;
      bool fits = static_cast<std::int64_t>(groups.numel()) == span;
      for (std::size_t k = 0; k < groups.size(); ++k)
        fits = fits && groups.numel(k) == std::min<std::int64_t>(37, span - groups.offset(k));
      counts[static_cast<std::size_t>(comm.rank())].push_back(fits ? groups.size() : 0);
    }
  });
  for (const auto& c : counts) {
    REQUIRE(c.size() == 3);  // the root and two blocks
    // tiny_gpt(): the root 13 * 6 + 8 * 6 + 2 * 6 = 138 elements padded to 138, 46 a rank: 2
    // pieces; a block 12 * 36 + 13 * 6 = 510, padded to 510, 170 a rank: 5 pieces.
    CHECK(c == std::vector<std::size_t>{2, 5, 5});
  }
}
