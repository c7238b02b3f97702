// GPT-2 weights in Hugging Face's published layout: Conv1D weights stored (in, out), names with
// or without the "transformer." prefix, and attention-mask buffers that are not parameters.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

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
  detail::add_parameters(
      writer, model, dtype, [](const std::string& name) { return name.substr(12); },  // drop "transformer."
      [](const std::string& name) { return detail::hf_gpt2_conv1d_weight(name); });
  writer.write(path);
}

}  // namespace polyshard
