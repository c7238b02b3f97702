// Module buffers: visited apart from parameters with PyTorch's names, their storage shared with
// the module, persistent or not.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "polyshard/nn/nn.hpp"

using namespace polyshard;

namespace {
struct Stats {
  BOOST_HANA_DEFINE_STRUCT(Stats, (Parameter<float>, scale), (Buffer<float>, running_mean),
                           (Buffer<std::int64_t>, steps));
  Stats() : scale({3}, ParameterInit::ones()), running_mean({3}, 0.5f), steps({1}, 0, /*persistent=*/false) {}
};
struct Net {
  BOOST_HANA_DEFINE_STRUCT(Net, (Linear<float>, proj), (std::vector<Stats>, stats));
  Net() : proj(3, 3) { stats.resize(2); }
};
}  // namespace

TEST_CASE("buffers are visited with PyTorch's names, apart from parameters, which they do not count among", "[nn]") {
  Net net;
  std::vector<std::string> buffers, parameters;
  visit_buffers(net, [&](const std::string& name, const auto& b) {
    buffers.push_back(name + (b.persistent() ? "" : " (not persistent)"));
  });
  visit_parameters(net, [&](const std::string& name, const auto&) { parameters.push_back(name); });
  CHECK(buffers == std::vector<std::string>{"stats.0.running_mean", "stats.0.steps (not persistent)",
                                            "stats.1.running_mean", "stats.1.steps (not persistent)"});
  CHECK(parameters == std::vector<std::string>{"proj.weight", "proj.bias", "stats.0.scale", "stats.1.scale"});
  CHECK(count_parameters(net) == 3 * 3 + 3 + 2 * 3);
}

TEST_CASE("a buffer's value shares its storage: a const module updates it in place", "[nn]") {
  const Stats stats;
  CHECK(stats.running_mean.value().to_vector() == std::vector<float>{0.5f, 0.5f, 0.5f});
  stats.running_mean.value().data()[1] = 2.0f;  // what a forward does to a running statistic
  ++stats.steps.value().data()[0];
  CHECK(stats.running_mean.value().to_vector() == std::vector<float>{0.5f, 2.0f, 0.5f});
  CHECK(stats.steps.value().to_vector() == std::vector<std::int64_t>{1});
  CHECK(stats.running_mean.shape() == Shape{3});
}
