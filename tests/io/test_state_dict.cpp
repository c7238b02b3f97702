// Full state dicts of a module and GPT-2 weights in Hugging Face's layout: exact round trips,
// and errors that name the missing, unexpected or mis-shaped tensor.
#include <catch2/catch.hpp>

#include <fstream>

#include "io/temp_dir.hpp"
#include "polyshard/io/hf_gpt2.hpp"
#include "polyshard/io/state_dict.hpp"
#include "polyshard/nn/nn.hpp"

using namespace polyshard;
namespace fs = std::filesystem;

namespace {
const GptConfig tiny{.vocab_size = 11, .block_size = 5, .n_layer = 2, .n_head = 2, .n_embd = 4};

/// A Gpt bound to its own flat buffers and initialised from `seed`.
template <FloatElement T>
struct Model {
  explicit Model(const GptConfig& cfg = tiny, std::uint64_t seed = 1) : gpt(cfg), flat(gpt) { flat.initialize(seed); }
  std::vector<T> values() const {
    auto v = flat.values().to_vector();
    v.resize(static_cast<std::size_t>(flat.numel()));
    return v;
  }
  Gpt<T> gpt;
  FlatParameters<T> flat;
};

std::vector<std::string> parameter_names(const Gpt<float>& m) {
  std::vector<std::string> names;
  visit_parameters(m, [&](const std::string& n, const auto&) { names.push_back(n); });
  return names;
}
}  // namespace

TEST_CASE("a GPT's state dict round-trips exactly and lists lm_head.weight as PyTorch does", "[io]") {
  TempDir dir;
  Model<float> a(tiny, 1), b(tiny, 2);
  REQUIRE(a.values() != b.values());
  save_state_dict(a.gpt, dir / "model.safetensors");

  const SafetensorsFile f = SafetensorsFile::open(dir / "model.safetensors");
  std::vector<std::string> in_file;
  for (const auto& t : f.tensors()) in_file.push_back(t.name);
  std::vector<std::string> expected = parameter_names(a.gpt);
  expected.push_back("lm_head.weight");
  std::sort(in_file.begin(), in_file.end());
  std::sort(expected.begin(), expected.end());
  CHECK(in_file == expected);
  CHECK(*f.metadata("format") == "pt");
  CHECK(f.read<float>("lm_head.weight").to_vector() == a.gpt.transformer.wte.weight.value().to_vector());
  CHECK(f.info("transformer.h.1.attn.c_attn.weight").shape == std::vector<std::int64_t>{12, 4});  // (3C, C)

  const LoadStateDictResult r = load_state_dict(b.gpt, dir / "model.safetensors");
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.empty());
  CHECK(b.values() == a.values());
}

TEST_CASE("a state dict saved as bf16 loads into an fp32 model rounded once", "[io]") {
  TempDir dir;
  Model<float> a(tiny, 3), b(tiny, 4);
  save_state_dict(a.gpt, dir / "bf16.safetensors", {.dtype = DType::BF16, .metadata = {{"step", "7"}}});
  const SafetensorsFile f = SafetensorsFile::open(dir / "bf16.safetensors");
  CHECK(f.info("transformer.wte.weight").dtype == SafetensorsDType::BF16);
  CHECK(*f.metadata("step") == "7");
  load_state_dict(b.gpt, dir / "bf16.safetensors");
  const auto va = a.values(), vb = b.values();
  for (std::size_t i = 0; i < va.size(); ++i) REQUIRE(vb[i] == static_cast<float>(element_cast<bfloat16>(va[i])));
  Model<float> c(tiny, 5);
  CHECK_THROWS_WITH(load_state_dict(c.gpt, dir / "bf16.safetensors", {.convert_dtype = false}),
                    Catch::Contains("is BF16 but parameter 'transformer.") && Catch::Contains("dtype conversion is off"));
}

TEST_CASE("loading a state dict that does not fit names what is wrong and leaves the module unchanged", "[io]") {
  TempDir dir;
  Model<float> two(tiny, 1);
  Model<float> three({.vocab_size = 11, .block_size = 5, .n_layer = 3, .n_head = 2, .n_embd = 4}, 2);
  Model<float> wide({.vocab_size = 11, .block_size = 5, .n_layer = 2, .n_head = 2, .n_embd = 6}, 3);
  save_state_dict(two.gpt, dir / "two.safetensors");
  save_state_dict(three.gpt, dir / "three.safetensors");
  save_state_dict(wide.gpt, dir / "wide.safetensors");

  Model<float> m(tiny, 9);
  const auto before = m.values();
  CHECK_THROWS_WITH(load_state_dict(m.gpt, dir / "three.safetensors"),
                    Catch::Contains("three.safetensors' does not match the module") &&
                        Catch::Contains("unexpected tensors 'transformer.h.2."));
  CHECK_THROWS_WITH(load_state_dict(three.gpt, dir / "two.safetensors"),
                    Catch::Contains("missing tensors 'transformer.h.2.ln_1.weight'"));
  CHECK_THROWS_WITH(load_state_dict(m.gpt, dir / "wide.safetensors"),
                    Catch::Contains("tensor 'transformer.wte.weight' has shape (11, 6) but parameter "
                                    "'transformer.wte.weight' needs (11, 4)"));
  CHECK(m.values() == before);

  const LoadStateDictResult r = load_state_dict(m.gpt, dir / "three.safetensors", {.strict = false});
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.size() == 12);  // the 12 tensors of block 2
  CHECK(m.gpt.transformer.h[1].mlp.c_fc.weight.value().to_vector() ==
        three.gpt.transformer.h[1].mlp.c_fc.weight.value().to_vector());
}

TEST_CASE("a tied lm_head.weight must equal the token embedding", "[io]") {
  TempDir dir;
  Model<float> a(tiny, 1), b(tiny, 2);
  SafetensorsWriter w;
  visit_parameters(a.gpt, [&](const std::string& n, const auto& p) { w.add(n, p.value()); });
  w.add("lm_head.weight", b.gpt.transformer.wte.weight.value());  // not the same as a's wte
  w.write(dir / "untied.safetensors");
  CHECK_THROWS_WITH(load_state_dict(b.gpt, dir / "untied.safetensors"),
                    Catch::Contains("'lm_head.weight' differs from 'transformer.wte.weight'"));

  save_state_dict(a.gpt, dir / "no-lm-head.safetensors", {.write_tied = false});
  CHECK_FALSE(SafetensorsFile::open(dir / "no-lm-head.safetensors").find("lm_head.weight"));
  load_state_dict(b.gpt, dir / "no-lm-head.safetensors");
  CHECK(b.values() == a.values());
}

namespace {
/// Writes `m` as Hugging Face publishes GPT-2, by hand: names without "transformer.", Conv1D
/// weights transposed to (in, out) element by element, and the attention-mask buffers.
void write_hf_layout(const Gpt<float>& m, const fs::path& path, bool prefix, bool lm_head) {
  SafetensorsWriter w;
  w.add_metadata("format", "pt");
  const std::int64_t n = m.config.block_size;
  visit_parameters(m, [&](const std::string& name, const auto& p) {
    std::string hf = prefix ? name : name.substr(std::string("transformer.").size());
    const bool conv1d = name.ends_with("c_attn.weight") || name.ends_with("c_proj.weight") || name.ends_with("c_fc.weight");
    if (!conv1d) {
      w.add(hf, p.value().clone());
      return;
    }
    const Tensor<float> v = p.value();  // (out, in)
    auto t = Tensor<float>::empty({v.size(1), v.size(0)});  // (in, out)
    for (std::int64_t o = 0; o < v.size(0); ++o)
      for (std::int64_t i = 0; i < v.size(1); ++i) t.at(i, o) = v.at(o, i);
    w.add(hf, t);
  });
  for (std::size_t l = 0; l < m.transformer.h.size(); ++l) {
    const std::string h = std::string(prefix ? "transformer." : "") + "h." + std::to_string(l) + ".attn.";
    w.add(h + "bias", Tensor<float>::full({1, 1, n, n}, 1.0f));
    w.add(h + "masked_bias", Tensor<float>::full({}, -1e4f));
  }
  if (lm_head) w.add("lm_head.weight", m.transformer.wte.weight.value().clone());
  w.write(path);
}
}  // namespace

TEST_CASE("GPT-2 weights in Hugging Face's layout load exactly", "[io]") {
  TempDir dir;
  const bool prefix = GENERATE(false, true);
  const bool lm_head = GENERATE(false, true);
  Model<float> a(tiny, 1), b(tiny, 2);
  write_hf_layout(a.gpt, dir / "model.safetensors", prefix, lm_head);
  const LoadStateDictResult r = load_hf_gpt2(b.gpt, dir / "model.safetensors");
  CHECK(r.unexpected_keys.empty());
  CHECK(b.values() == a.values());
  // The same weights compute the same logits.
  const auto ids = Tensor<std::int32_t>::from({1, 4}, {1, 7, 3, 10});
  NoGradGuard no_grad;
  CHECK(b.gpt.logits(ids).value().to_vector() == a.gpt.logits(ids).value().to_vector());
}

TEST_CASE("GPT-2 in Hugging Face's layout: a plain state dict load refuses it, sizes must match", "[io]") {
  TempDir dir;
  Model<float> a(tiny, 1);
  write_hf_layout(a.gpt, dir / "hf.safetensors", false, false);
  Model<float> b(tiny, 2);
  CHECK_THROWS_WITH(load_state_dict(b.gpt, dir / "hf.safetensors"), Catch::Contains("unexpected tensors 'h.0."));
  Model<float> small({.vocab_size = 11, .block_size = 5, .n_layer = 2, .n_head = 2, .n_embd = 8}, 2);
  CHECK_THROWS_WITH(load_hf_gpt2(small.gpt, dir / "hf.safetensors"),
                    Catch::Contains("has shape (4, 12) but parameter 'transformer.h.0.attn.c_attn.weight' needs (32, 8) "
                                    "(its transpose, Conv1D layout)") ||
                        Catch::Contains("'transformer.wpe.weight' needs (5, 8)") ||
                        Catch::Contains("'transformer.wte.weight' needs (11, 8)") ||
                        Catch::Contains("needs (8,)"));
}

TEST_CASE("save_hf_gpt2 writes Hugging Face's layout and load_hf_gpt2 reads it back", "[io]") {
  TempDir dir;
  Model<float> a(tiny, 1), b(tiny, 2);
  save_hf_gpt2(a.gpt, dir / "model.safetensors");
  const SafetensorsFile f = SafetensorsFile::open(dir / "model.safetensors");
  CHECK(f.info("h.0.attn.c_attn.weight").shape == std::vector<std::int64_t>{4, 12});  // (C, 3C): Conv1D
  CHECK(f.info("h.1.mlp.c_fc.weight").shape == std::vector<std::int64_t>{4, 16});
  CHECK(f.read<float>("h.0.attn.c_attn.weight").at(1, 5) == a.gpt.transformer.h[0].attn.c_attn.weight.value().at(5, 1));
  CHECK_FALSE(f.find("lm_head.weight"));
  CHECK_FALSE(f.find("transformer.wte.weight"));
  load_hf_gpt2(b.gpt, dir / "model.safetensors");
  CHECK(b.values() == a.values());
}

TEST_CASE("read_hf_gpt2_config reads GPT-2's published config.json and refuses what Gpt cannot compute", "[io]") {
  TempDir dir;
  // The published gpt2 config.json's keys and values (fractions, booleans, a nested object).
  const std::string published = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257})";
  auto write = [&](const std::string& text) {
    std::ofstream(dir / "config.json") << text;
    return dir / "config.json";
  };
  const GptConfig c = read_hf_gpt2_config(write(published));
  CHECK((c.vocab_size == 50257 && c.block_size == 1024 && c.n_layer == 12 && c.n_head == 12 && c.n_embd == 768));

  // What write_hf_gpt2_config writes reads back.
  write_hf_gpt2_config({.vocab_size = 300, .block_size = 64, .n_layer = 3, .n_head = 4, .n_embd = 32}, dir / "out.json");
  const GptConfig back = read_hf_gpt2_config(dir / "out.json");
  CHECK((back.vocab_size == 300 && back.block_size == 64 && back.n_layer == 3 && back.n_head == 4 && back.n_embd == 32));

  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = published;
    text.replace(text.find(from), from.size(), to);
    return write(text);
  };
  CHECK_THROWS_WITH(read_hf_gpt2_config(with("\"gelu_new\"", "\"relu\"")),
                    Catch::Contains("\"activation_function\" is \"relu\""));
  CHECK_THROWS_WITH(read_hf_gpt2_config(with("1e-05", "1e-06")), Catch::Contains("\"layer_norm_epsilon\" is 1e-06"));
  CHECK_THROWS_WITH(read_hf_gpt2_config(with("\"n_layer\": 12", "\"n_layer\": \"12\"")),
                    Catch::Contains("\"n_layer\" must be a positive integer, not a string"));
  CHECK_THROWS_WITH(read_hf_gpt2_config(with("\"n_embd\": 768,", "")), Catch::Contains("has no \"n_embd\""));
  CHECK_THROWS_WITH(read_hf_gpt2_config(with("\"vocab_size\": 50257}", "\"vocab_size\": 50257,}")),
                    Catch::Contains("invalid JSON at byte"));
  CHECK_THROWS_WITH(read_hf_gpt2_config(dir / "absent.json"), Catch::Contains("cannot open"));
}

TEST_CASE("parse_json_document reads the whole grammar, parse_json stays strict for tensor headers", "[io]") {
  const JsonValue v = parse_json_document(R"([1.5e3, -0.25, 2E-2, true, false, null, 7])");
  REQUIRE(v.elements.size() == 7);
  CHECK(v.elements[0].kind == JsonValue::Kind::Number);
  CHECK(v.elements[0].number == 1500.0);
  CHECK(v.elements[1].number == -0.25);
  CHECK(v.elements[2].number == 0.02);
  CHECK((v.elements[3].kind == JsonValue::Kind::Boolean && v.elements[3].boolean));
  CHECK((v.elements[4].kind == JsonValue::Kind::Boolean && !v.elements[4].boolean));
  CHECK(v.elements[5].kind == JsonValue::Kind::Null);
  CHECK((v.elements[6].kind == JsonValue::Kind::Integer && v.elements[6].integer == 7));
  CHECK_THROWS_WITH(parse_json_document("[1.]"), Catch::Contains("expected digit after '.'"));
  CHECK_THROWS_WITH(parse_json_document("[1e+]"), Catch::Contains("expected digit after exponent sign"));
  CHECK_THROWS_WITH(parse_json_document("[nul]"), Catch::Contains("invalid literal"));
  CHECK_THROWS_WITH(parse_json_document("[1e999]"), Catch::Contains("number overflow"));
  CHECK_THROWS_WITH(parse_json("[1.5]"), Catch::Contains("only integers are expected here"));
  CHECK_THROWS_WITH(parse_json("[true]"), Catch::Contains("true, false and null are not expected here"));
}

namespace {
/// A module with buffers: two persistent (one float, one int64), one not.
struct Normed {
  BOOST_HANA_DEFINE_STRUCT(Normed, (LayerNorm<float>, norm), (Buffer<float>, running_mean),
                           (Buffer<std::int64_t>, seen), (Buffer<float>, scratch));
  Normed() : norm(3), running_mean({3}, 0.0f), seen({1}, 0), scratch({2}, 0.0f, /*persistent=*/false) {}
};
}  // namespace

TEST_CASE("a state dict holds a module's persistent buffers in their own dtype and loads them back", "[io]") {
  TempDir dir;
  Normed a;
  FlatParameters<float> flat_a(a);
  flat_a.initialize(1);
  float* mean = a.running_mean.value().data();
  mean[0] = 1.5f, mean[1] = -2.0f, mean[2] = 3.25f;
  a.seen.value().data()[0] = 7;
  a.scratch.value().data()[0] = 9.0f;
  save_state_dict(a, dir / "normed.safetensors");

  const SafetensorsFile f = SafetensorsFile::open(dir / "normed.safetensors");
  std::vector<std::string> in_file;
  for (const auto& t : f.tensors()) in_file.push_back(t.name);
  std::sort(in_file.begin(), in_file.end());
  CHECK(in_file == std::vector<std::string>{"norm.bias", "norm.weight", "running_mean", "seen"});  // not scratch
  CHECK(f.info("seen").dtype == SafetensorsDType::I64);

  Normed b;
  FlatParameters<float> flat_b(b);
  flat_b.initialize(2);
  const LoadStateDictResult r = load_state_dict(b, dir / "normed.safetensors");
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.empty());
  CHECK(b.running_mean.value().to_vector() == a.running_mean.value().to_vector());
  CHECK(b.seen.value().to_vector() == std::vector<std::int64_t>{7});
  CHECK(b.scratch.value().to_vector() == std::vector<float>{0.0f, 0.0f});  // not persistent: left alone
  CHECK(flat_b.values().to_vector() == flat_a.values().to_vector());
}

TEST_CASE("loading a state dict names a missing or mis-shaped buffer and writes nothing", "[io]") {
  TempDir dir;
  Normed a;
  FlatParameters<float> flat_a(a);
  flat_a.initialize(1);
  {
    SafetensorsWriter w;  // the parameters without the buffers
    w.add("norm.weight", a.norm.weight.value());
    w.add("norm.bias", a.norm.bias.value());
    w.write(dir / "no_buffers.safetensors");
  }
  Normed b;
  FlatParameters<float> flat_b(b);
  flat_b.initialize(2);
  CHECK_THROWS_WITH(load_state_dict(b, dir / "no_buffers.safetensors"),
                    Catch::Contains("running_mean") && Catch::Contains("seen") && !Catch::Contains("scratch"));
  const LoadStateDictResult lenient = load_state_dict(b, dir / "no_buffers.safetensors", {.strict = false});
  std::vector<std::string> missing = lenient.missing_keys;
  std::sort(missing.begin(), missing.end());
  CHECK(missing == std::vector<std::string>{"running_mean", "seen"});
  {
    SafetensorsWriter w;
    w.add("norm.weight", a.norm.weight.value());
    w.add("norm.bias", a.norm.bias.value());
    w.add("running_mean", Tensor<float>::zeros({4}));
    w.add("seen", Tensor<std::int64_t>::zeros({1}));
    w.write(dir / "wrong_shape.safetensors");
  }
  Normed c;
  FlatParameters<float> flat_c(c);
  flat_c.initialize(3);
  const auto before = flat_c.values().to_vector();
  CHECK_THROWS_WITH(load_state_dict(c, dir / "wrong_shape.safetensors"),
                    Catch::Contains("tensor 'running_mean' has shape (4,)") && Catch::Contains("needs (3,)"));
  CHECK(flat_c.values().to_vector() == before);
}
