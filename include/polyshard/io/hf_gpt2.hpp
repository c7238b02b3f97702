// GPT-2 weights in Hugging Face's published layout: Conv1D weights stored (in, out), names with
// or without the "transformer." prefix, and attention-mask buffers that are not parameters.
#pragma once

#include <filesystem>
#include <sstream>
#include <string>
#include <string_view>

#include "polyshard/core/read_file.hpp"
#include "polyshard/io/atomic_file.hpp"
#include "polyshard/io/full_weights.hpp"
#include "polyshard/io/json.hpp"
#include "polyshard/io/state_dict.hpp"
#include "polyshard/nn/gpt.hpp"

namespace polyshard {

namespace detail {

/// True for the weights HF's GPT-2 keeps in Conv1D (in, out) layout, where polyshard's Linear
/// holds (out, in): attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj of every block.
inline bool hf_gpt2_conv1d_weight(std::string_view name) {
  for (std::string_view suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return false;
}

/// True for HF GPT-2's non-parameter buffers (the causal mask "attn.bias" and "attn.masked_bias"),
/// which older transformers versions save beside the weights.
inline bool hf_gpt2_buffer(std::string_view name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name == "attn.bias" ||
         name == "attn.masked_bias";
}

}  // namespace detail

/// Hugging Face's GPT-2 layout for save_full_weights and load_full_weights: names without
/// "transformer.", Conv1D weights stored (in, out), the attention-mask buffers ignored.
inline WeightLayout hf_gpt2_layout() {
  WeightLayout layout;
  layout.file_name = [](const std::string& name) { return name.starts_with("transformer.") ? name.substr(12) : name; };
  layout.transposed = [](const std::string& name) { return detail::hf_gpt2_conv1d_weight(name); };
  layout.ignored = [](const std::string& name) { return detail::hf_gpt2_buffer(name); };
  return layout;
}

/// Loads GPT-2 weights saved by Hugging Face (GPT2LMHeadModel or GPT2Model, "model.safetensors"
/// as published on the Hub) into a bound Gpt. Names may carry the "transformer." prefix or not;
/// Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are transposed from (in, out)
/// into Linear's (out, in); the attention-mask buffers "h.N.attn.bias" and "h.N.attn.masked_bias"
/// are ignored; "lm_head.weight", if present, must equal the token embedding. The model's sizes
/// must match the file's (an error names the first tensor that does not).
/// @param model    a Gpt whose parameters are bound
/// @param path     the safetensors file
/// @param options  strictness and dtype conversion (HF files are F32; an F16 or BF16 model converts)
template <FloatElement T>
LoadStateDictResult load_hf_gpt2(Gpt<T>& model, const std::filesystem::path& path,
                                 const LoadStateDictOptions& options = {}) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  return detail::load_mapped(
      model, file,
      [](const std::string& name) {
        using Kind = detail::FileKey::Kind;
        if (name == "lm_head.weight") return detail::FileKey{Kind::alias, "transformer.wte.weight"};
        const std::string bare = name.starts_with("transformer.") ? name.substr(12) : name;
        if (detail::hf_gpt2_buffer(bare)) return detail::FileKey{Kind::ignored, {}};
        return detail::FileKey{Kind::parameter, "transformer." + bare, detail::hf_gpt2_conv1d_weight(bare)};
      },
      options, "load_hf_gpt2");
}

/// Saves a bound Gpt in Hugging Face's GPT-2 layout (what GPT2LMHeadModel.save_pretrained
/// writes to model.safetensors): names without "transformer.", Conv1D weights transposed to
/// (in, out), no "lm_head.weight" (HF re-ties it on load), metadata {"format": "pt"}. Put it
/// beside a config.json to load it with from_pretrained.
/// @param dtype  stored dtype, by default the model's element type
template <FloatElement T>
void save_hf_gpt2(const Gpt<T>& model, const std::filesystem::path& path, std::optional<DType> dtype = std::nullopt) {
  SafetensorsWriter writer;
  writer.add_metadata("format", "pt");
  const WeightLayout layout = hf_gpt2_layout();
  detail::add_parameters(writer, model, dtype, layout.file_name, layout.transposed);
  writer.write(path);
}

/// The sizes in a GPT-2 config.json (GPT2Config's n_layer, n_head, n_embd, n_positions,
/// vocab_size). What polyshard's Gpt computes is checked too: model_type "gpt2", GELU's tanh
/// approximation (activation_function "gelu_new"), layer_norm_epsilon 1e-5, n_inner null or
/// 4 n_embd, tied embeddings; an error names the key and the value that differ.
inline GptConfig read_hf_gpt2_config(const std::filesystem::path& path) {
  const std::string text = read_file(path, "read_hf_gpt2_config");
  JsonValue doc;
  try {
    doc = parse_json_document(text);
  } catch (const Error& e) {
    detail::throw_error("read_hf_gpt2_config: '", path.string(), "': ", e.what());
  }
  const std::string where = "read_hf_gpt2_config: '" + path.string() + "'";
  POLYSHARD_CHECK(doc.kind == JsonValue::Kind::Object, where, " is not a JSON object");
  auto integer = [&](const char* key) {
    const JsonValue* v = doc.find(key);
    POLYSHARD_CHECK(v, where, " has no \"", key, "\"");
    POLYSHARD_CHECK(v->kind == JsonValue::Kind::Integer && v->integer >= 1, where, ": \"", key,
                    "\" must be a positive integer, not ", json_kind_name(v->kind), " ", v->integer);
    return v->integer;
  };
  auto expect_string = [&](const char* key, std::string_view want) {
    if (const JsonValue* v = doc.find(key))
      POLYSHARD_CHECK(v->kind == JsonValue::Kind::String && v->string == want, where, ": \"", key, "\" is \"",
                      v->string, "\"; polyshard's Gpt computes \"", want, "\"");
  };
  expect_string("model_type", "gpt2");
  expect_string("activation_function", "gelu_new");
  if (const JsonValue* v = doc.find("layer_norm_epsilon")) {
    const double eps = v->kind == JsonValue::Kind::Number ? v->number : static_cast<double>(v->integer);
    POLYSHARD_CHECK(std::abs(eps - 1e-5) <= 1e-12, where, ": \"layer_norm_epsilon\" is ", eps,
                    "; polyshard's Gpt computes with 1e-05");
  }
  if (const JsonValue* v = doc.find("tie_word_embeddings"))
    POLYSHARD_CHECK(v->kind == JsonValue::Kind::Boolean && v->boolean, where,
                    ": \"tie_word_embeddings\" is false; polyshard's Gpt ties its head to the token embedding");
  GptConfig c{.vocab_size = integer("vocab_size"), .block_size = integer("n_positions"), .n_layer = integer("n_layer"),
              .n_head = integer("n_head"), .n_embd = integer("n_embd")};
  if (const JsonValue* v = doc.find("n_inner"); v && v->kind != JsonValue::Kind::Null)
    POLYSHARD_CHECK(v->kind == JsonValue::Kind::Integer && v->integer == 4 * c.n_embd, where, ": \"n_inner\" is ",
                    v->integer, "; polyshard's Gpt has an MLP of 4 n_embd = ", 4 * c.n_embd);
  return c;
}

/// Writes the config.json of GPT2LMHeadModel for `c`: its sizes, GPT-2's GELU and LayerNorm
/// epsilon, no dropout (polyshard trains without it), tied embeddings. Written atomically.
inline void write_hf_gpt2_config(const GptConfig& c, const std::filesystem::path& path) {
  std::ostringstream out;
  out << "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
      << "  \"vocab_size\": " << c.vocab_size << ",\n  \"n_positions\": " << c.block_size << ",\n  \"n_embd\": "
      << c.n_embd << ",\n  \"n_layer\": " << c.n_layer << ",\n  \"n_head\": " << c.n_head
      << ",\n  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
      << "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n  \"initializer_range\": 0.02,\n"
      << "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\"\n}\n";
  const std::string text = out.str();
  write_file_atomically(path, [&](FileSink& sink) { sink.write(std::as_bytes(std::span(text.data(), text.size()))); });
}

/// Writes `engine`'s model as a directory that GPT2LMHeadModel.from_pretrained(dir) loads:
/// config.json and model.safetensors in Hugging Face's layout, gathered from every shard (a
/// collective: every rank calls it; rank 0 writes).
template <class E>
void save_hf_gpt2_pretrained(E& engine, const GptConfig& config, const std::filesystem::path& dir) {
  std::string error = detail::attempt([&] {
    if (engine.communicator().rank() == 0) {
      std::filesystem::create_directories(dir);
      write_hf_gpt2_config(config, dir / "config.json");
    }
  });
  detail::agree_or_throw<typename E::device>(engine.communicator(), error, "save_hf_gpt2_pretrained", dir);
  save_full_weights(engine, dir / "model.safetensors", {}, std::nullopt, hf_gpt2_layout());
}

/// Loads a save_pretrained directory of GPT-2 (config.json, model.safetensors) into `engine`'s
/// model, every rank reading its own shards. The model must have been built with
/// read_hf_gpt2_config(dir / "config.json")'s sizes; "lm_head.weight", if the file has it,
/// is the tied embedding and is not read. A collective.
template <class E>
void load_hf_gpt2_pretrained(E& engine, const std::filesystem::path& dir) {
  load_full_weights(engine, dir / "model.safetensors", {{.alias = "lm_head.weight", .source = "transformer.wte.weight"}},
                    hf_gpt2_layout());
}

}  // namespace polyshard
