// Reflection of module trees: PyTorch names, counts, flat binding and deterministic init.
#include <catch2/catch.hpp>

#include "polyshard/nn/nn.hpp"

using namespace polyshard;

TEST_CASE("GPT-2 small counts exactly 124,439,808 parameters", "[nn]") {
  Gpt<float> model(GptConfig{});  // shapes only: no storage is allocated until binding
  CHECK(count_parameters(model) == 124'439'808);
}

TEST_CASE("parameters carry PyTorch's names, in module order", "[nn]") {
  GptConfig cfg{.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 4};
  Gpt<double> model(cfg);
  std::vector<std::string> names;
  visit_parameters(model, [&](const std::string& name, const Parameter<double>&) { names.push_back(name); });
  REQUIRE(names.size() == 2 + 2 * 12 + 2);
  CHECK(names[0] == "transformer.wte.weight");
  CHECK(names[1] == "transformer.wpe.weight");
  CHECK(names[2] == "transformer.h.0.ln_1.weight");
  CHECK(names[4] == "transformer.h.0.attn.c_attn.weight");
  CHECK(names[7] == "transformer.h.0.attn.c_proj.bias");
  CHECK(names[10] == "transformer.h.0.mlp.c_fc.weight");
  CHECK(names[13] == "transformer.h.0.mlp.c_proj.bias");
  CHECK(names[14] == "transformer.h.1.ln_1.weight");
  CHECK(names.back() == "transformer.ln_f.bias");
}

TEST_CASE("flat binding: every parameter is a view of one buffer, padded to a multiple", "[nn]") {
  GptConfig cfg{.vocab_size = 13, .block_size = 5, .n_layer = 1, .n_head = 1, .n_embd = 3};
  Gpt<float> model(cfg);
  FlatParameters<float> flat(model, 4);
  CHECK(flat.numel() == count_parameters(model));
  CHECK(flat.padded_numel() % 4 == 0);
  CHECK(flat.padded_numel() - flat.numel() < 4);
  std::int64_t expected_offset = 0;
  for (const auto& e : flat.entries()) {
    CHECK(e.offset == expected_offset);
    CHECK(e.parameter->value().data() == flat.values().data() + e.offset);
    CHECK(e.parameter->name() == e.name);
    expected_offset += e.numel();
  }
}

TEST_CASE("GPT-2 initialisation: statistics and determinism", "[nn]") {
  GptConfig cfg{.vocab_size = 256, .block_size = 64, .n_layer = 8, .n_head = 4, .n_embd = 64};
  Gpt<double> model(cfg);
  FlatParameters<double> flat(model);
  flat.initialize(42);
  auto stats = [](const Tensor<double>& t) {
    double s = 0, s2 = 0;
    for (double x : t.span()) s += x, s2 += x * x;
    const double n = double(t.numel());
    return std::pair{s / n, std::sqrt(s2 / n - (s / n) * (s / n))};
  };
  auto [wte_mean, wte_std] = stats(model.transformer.wte.weight.value());
  CHECK(std::abs(wte_mean) < 0.002);
  CHECK(wte_std == Approx(0.02).epsilon(0.03));
  auto [proj_mean, proj_std] = stats(model.transformer.h[3].mlp.c_proj.weight.value());
  CHECK(proj_std == Approx(0.02 / std::sqrt(16.0)).epsilon(0.03));
  CHECK(stats(model.transformer.h[0].attn.c_attn.bias.value()).second == 0.0);
  for (double x : model.transformer.ln_f.weight.value().span()) CHECK(x == 1.0);

  // Same seed, same values; a slice initialised alone equals the same slice of the whole.
  Gpt<double> again(cfg);
  FlatParameters<double> flat2(again);
  flat2.initialize(42);
  CHECK(flat.values().to_vector() == flat2.values().to_vector());
  const auto& e = flat.entries()[0];
  std::vector<double> part(100);
  initialize_slice(std::span<double>(part), 1000, e.init, e.name, 42);
  for (int i = 0; i < 100; ++i) CHECK(part[i] == flat.values().data()[e.offset + 1000 + i]);
}

TEST_CASE("an unbound parameter is an error that names it", "[nn]") {
  Linear<float> lin(3, 2);
  CHECK_THROWS_WITH(lin.weight.var(), Catch::Contains("has no storage") && Catch::Contains("(2, 3)"));
  FlatParameters<float> flat(lin);
  lin.weight.unbind();
  CHECK_THROWS_WITH(lin(Var<float>(Tensor<float>::zeros({1, 3}))), Catch::Contains("'weight'"));
}
