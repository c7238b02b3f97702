// GPT-2: token and position embeddings, a stack of pre-LN blocks, a final LayerNorm, and a
// language-model head tied to the token embedding.
#pragma once

#include <cmath>
#include <vector>

#include "polyshard/autograd/checkpoint.hpp"
#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/block.hpp"
#include "polyshard/nn/embedding.hpp"
#include "polyshard/nn/generate.hpp"

namespace polyshard {

/// Sizes of a GPT. The defaults are GPT-2 small (124,439,808 parameters).
struct GptConfig {
  std::int64_t vocab_size = 50257;
  std::int64_t block_size = 1024;  ///< longest sequence (number of positions)
  std::int64_t n_layer = 12;
  std::int64_t n_head = 12;
  std::int64_t n_embd = 768;
};

/// The `transformer` submodule, named as in Hugging Face's GPT2LMHeadModel.
template <FloatElement T, Device D = Cpu>
struct GptTransformer {
  BOOST_HANA_DEFINE_STRUCT(GptTransformer, (Embedding<T, D>, wte), (Embedding<T, D>, wpe), (std::vector<Block<T, D>>, h),
                           (LayerNorm<T, D>, ln_f));
};

template <FloatElement T, Device D = Cpu>
struct Gpt {
  /// What it computes in and where (an engine reads these).
  using element_type = T;
  using device_type = D;
  BOOST_HANA_DEFINE_STRUCT(Gpt, (GptTransformer<T, D>, transformer));
  GptConfig config;
  /// Recompute each block's activations in backward instead of keeping them.
  bool checkpoint_blocks = false;

  /// Builds the module tree with GPT-2's initialisation: weights normal(0, 0.02), residual
  /// projections (attn.c_proj, mlp.c_proj) normal(0, 0.02 / sqrt(2 * n_layer)), LayerNorms
  /// ones and zeros. Parameters get storage when bound (FlatParameters).
  explicit Gpt(const GptConfig& cfg) : config(cfg) {
    POLYSHARD_CHECK(cfg.vocab_size >= 1 && cfg.block_size >= 1 && cfg.n_layer >= 0 && cfg.n_embd >= 1,
                    "Gpt: every size must be positive (vocab ", cfg.vocab_size, ", positions ", cfg.block_size,
                    ", layers ", cfg.n_layer, ", width ", cfg.n_embd, ")");
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(std::max<std::int64_t>(cfg.n_layer, 1)));
    transformer.wte = Embedding<T, D>(cfg.vocab_size, cfg.n_embd);
    transformer.wpe = Embedding<T, D>(cfg.block_size, cfg.n_embd);
    transformer.h.reserve(static_cast<std::size_t>(cfg.n_layer));
    for (std::int64_t i = 0; i < cfg.n_layer; ++i)
      transformer.h.emplace_back(cfg.n_embd, static_cast<int>(cfg.n_head), proj_std);
    transformer.ln_f = LayerNorm<T, D>(cfg.n_embd);
  }
  // Parameters are bound by address: a model does not move once built.
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  /// ids: (B, T) token ids, T <= block_size -> logits (B, T, vocab_size).
  Var<T, D> logits(const Tensor<std::int32_t, D>& ids) const {
    return linear(hidden(ids), transformer.wte.weight.var());  // (B, T, V): the head shares wte
  }

  /// Mean cross-entropy of predicting `targets` (B, T) from `ids` (B, T): the head and the loss
  /// in one op (linear_cross_entropy), which on a GPU pads the logits' rows and keeps the loss on
  /// the device.
  Var<T, D> loss(const Tensor<std::int32_t, D>& ids, const Tensor<std::int32_t, D>& targets) const {
    return linear_cross_entropy(hidden(ids), transformer.wte.weight.var(), targets);
  }

  /// An empty key-value cache for `batch` sequences of up to block_size positions.
  KvCache<T> make_kv_cache(std::int64_t batch = 1) const
    requires std::same_as<D, Cpu>
  {
    return KvCache<T>(config.n_layer, batch, config.block_size, config.n_embd);
  }

  /// ids: (B, T) tokens at positions cache.length() onwards -> logits (B, T, vocab_size), the
  /// rows logits() gives for them after the cached prefix; caches their keys and values. For
  /// generation (no backward).
  Var<T, D> logits(const Tensor<std::int32_t, D>& ids, KvCache<T>& cache) const
    requires std::same_as<D, Cpu>
  {
    POLYSHARD_CHECK(cache.layers() == transformer.h.size(), "Gpt: a cache of ", cache.layers(),
                    " layers for a model of ", transformer.h.size());
    Var<T, D> x = embed(ids, cache.length());
    for (std::size_t i = 0; i < transformer.h.size(); ++i) {
      const Block<T, D>& block = transformer.h[i];
      x = call_as(block, x, [&](const Var<T, D>& in) { return block.forward_cached(in, cache, i); });
    }
    x = call(transformer.ln_f, x);
    cache.advance(ids.size(1));
    return linear(x, transformer.wte.weight.var());
  }

  /// The prompt followed by c.new_tokens tokens drawn from this model, with a key-value cache
  /// (polyshard::generate). On the host.
  std::vector<std::int32_t> generate(std::span<const std::int32_t> prompt, const SamplingConfig& c) const
    requires std::same_as<D, Cpu>
  {
    return polyshard::generate(*this, prompt, c);
  }

 private:
  /// The final layer norm's output (B, T, C) for ids (B, T): what the head reads.
  Var<T, D> hidden(const Tensor<std::int32_t, D>& ids) const {
    Var<T, D> x = embed(ids, 0);  // (B, T, C)
    for (const Block<T, D>& block : transformer.h) {
      if (checkpoint_blocks)
        x = checkpoint([&block](const Var<T, D>& in) { return call(block, in); }, x);
      else
        x = call(block, x);
    }
    return call(transformer.ln_f, x);
  }

  /// Token plus position embeddings of ids (B, T) at positions past to past + T - 1.
  Var<T, D> embed(const Tensor<std::int32_t, D>& ids, std::int64_t past) const {
    POLYSHARD_CHECK(ids.rank() == 2, "Gpt: token ids must have shape (B, T), got ", ids.shape());
    const std::int64_t batch = ids.size(0), steps = ids.size(1);
    if (past == 0)
      POLYSHARD_CHECK(steps <= config.block_size, "Gpt: sequence of length ", steps, " is longer than the model's ",
                      config.block_size, " positions");
    else
      POLYSHARD_CHECK(past + steps <= config.block_size, "Gpt: ", past, " cached and ", steps,
                      " new positions exceed the model's ", config.block_size, " positions");
    return add(transformer.wte(ids), transformer.wpe(positions(batch, steps, past)));
  }

  /// Positions past .. past + T - 1 of B sequences (B, T), made on the host. On a device they are
  /// kept for the next call of the same shape: a copy to the device is waited for, and a training
  /// step should wait for nothing.
  Tensor<std::int32_t, D> positions(std::int64_t batch, std::int64_t steps, std::int64_t past) const {
    if constexpr (!std::same_as<D, Cpu>) {
      if (device_positions_.defined() && device_positions_.shape() == Shape{batch, steps} &&
          device_positions_past_ == past)
        return device_positions_;
    }
    auto host = Tensor<std::int32_t>::empty({batch, steps});  // (B, T)
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t t = 0; t < steps; ++t) host.data()[b * steps + t] = static_cast<std::int32_t>(past + t);
    if constexpr (std::same_as<D, Cpu>) {
      return host;
    } else {
      device_positions_ = on_device<D>(host, MemoryCategory::Other);
      device_positions_past_ = past;
      return device_positions_;
    }
  }

  mutable Tensor<std::int32_t, D> device_positions_;  // the last positions made on a device
  mutable std::int64_t device_positions_past_ = -1;
};

}  // namespace polyshard
