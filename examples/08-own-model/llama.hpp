// A Llama-style decoder defined in this example's own code, not the library's: RMSNorm, rotary
// grouped-query attention, SwiGLU feed-forward layers and an untied output head. The structs are
// laid out as Hugging Face's LlamaForCausalLM, so the reflected parameter names are its state
// dict's names ("model.layers.0.self_attn.q_proj.weight") and no mapping is needed.
#pragma once

#include <vector>

#include <polyshard/polyshard.hpp>

namespace own {

using namespace polyshard;

/// The sizes, with config.json's names beside them.
struct LlamaConfig {
  std::int64_t vocab_size = 256;         // vocab_size (bytes)
  std::int64_t hidden_size = 48;         // hidden_size
  std::int64_t intermediate_size = 128;  // intermediate_size
  int num_hidden_layers = 2;             // num_hidden_layers
  int num_attention_heads = 4;           // num_attention_heads
  int num_key_value_heads = 2;           // num_key_value_heads
  double rms_norm_eps = 1e-5;            // rms_norm_eps
  double rope_theta = 10000.0;           // rope_theta
  std::int64_t max_position_embeddings = 32;
};

// [model]
/// Pre-norm residual layer: x + attention(norm(x)), then h + mlp(norm(h)).
struct DecoderLayer {
  BOOST_HANA_DEFINE_STRUCT(DecoderLayer, (RMSNorm<float>, input_layernorm), (GroupedQueryAttention<float>, self_attn),
                           (RMSNorm<float>, post_attention_layernorm), (SwiGlu<float>, mlp));

  explicit DecoderLayer(const LlamaConfig& c)
      : input_layernorm(c.hidden_size, c.rms_norm_eps),
        self_attn(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.rope_theta),
        post_attention_layernorm(c.hidden_size, c.rms_norm_eps),
        mlp(c.hidden_size, c.intermediate_size) {}

  /// x: (B, T, C) -> (B, T, C). Children through call(): under a sharding policy that wraps
  /// them, the engine gathers them around the call.
  Var<float> operator()(const Var<float>& x) const {
    const Var<float> h = x + call(self_attn, call(input_layernorm, x));
    return h + call(mlp, call(post_attention_layernorm, h));
  }
  /// The same at positions cache.length() onwards, caching keys and values in layer `i`.
  Var<float> forward_cached(const Var<float>& x, KvCache<float>& cache, std::size_t i) const {
    const auto attend = [&](const Var<float>& in) { return self_attn.forward_cached(in, cache, i); };
    const Var<float> h = x + call_as(self_attn, call(input_layernorm, x), attend);
    return h + call(mlp, call(post_attention_layernorm, h));
  }
};

/// Hugging Face's LlamaModel: the token embedding, the layers and the final norm.
struct Decoder {
  BOOST_HANA_DEFINE_STRUCT(Decoder, (Embedding<float>, embed_tokens), (std::vector<DecoderLayer>, layers),
                           (RMSNorm<float>, norm));

  explicit Decoder(const LlamaConfig& c) : embed_tokens(c.vocab_size, c.hidden_size), norm(c.hidden_size, c.rms_norm_eps) {
    for (int i = 0; i < c.num_hidden_layers; ++i) layers.emplace_back(c);
  }
};

/// Hugging Face's LlamaForCausalLM: the decoder and an untied head.
struct Llama {
  BOOST_HANA_DEFINE_STRUCT(Llama, (Decoder, model), (LinearNoBias<float>, lm_head));

  explicit Llama(const LlamaConfig& c)
      : model(c), lm_head(c.hidden_size, c.vocab_size), positions(c.max_position_embeddings) {}
  // Parameters are bound by address: the model must not move once an engine holds it.
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  /// ids: (B, T) -> logits (B, T, vocab_size).
  Var<float> logits(const Tensor<std::int32_t>& ids) const {
    Var<float> x = model.embed_tokens(ids);  // (B, T, C)
    for (const DecoderLayer& layer : model.layers) x = call(layer, x);
    return call(lm_head, call(model.norm, x));
  }
  /// Mean cross-entropy of predicting `targets` (B, T) from `ids` (B, T).
  Var<float> loss(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets) const {
    return cross_entropy(logits(ids), targets);
  }

  // What polyshard::generate needs: a cache, and logits of new positions after the cached ones.
  KvCache<float> make_kv_cache(std::int64_t batch) const {
    return KvCache<float>(std::int64_t(model.layers.size()), batch, positions, model.layers.at(0).self_attn.kv_width());
  }
  Var<float> logits(const Tensor<std::int32_t>& ids, KvCache<float>& cache) const {
    Var<float> x = model.embed_tokens(ids);
    for (std::size_t i = 0; i < model.layers.size(); ++i) {
      const DecoderLayer& layer = model.layers[i];
      x = call_as(layer, x, [&](const Var<float>& in) { return layer.forward_cached(in, cache, i); });
    }
    cache.advance(ids.size(1));
    return call(lm_head, call(model.norm, x));
  }

  std::int64_t positions;  // the longest sequence a cache holds (max_position_embeddings)
};
// [model]

}  // namespace own
