// Generation through an engine: every rank runs each forward under the strategy's hooks, so a
// sharded model is gathered unit by unit for every token as in training, and every rank
// continues from rank 0's token.
#pragma once

#include <span>
#include <vector>

#include "polyshard/comm/host_values.hpp"
#include "polyshard/nn/generate.hpp"

namespace polyshard {

/// polyshard::generate(model, prompt, c) on every rank of `engine`'s communicator (a collective:
/// every rank calls it, with the same prompt and config). Each token is broadcast from rank 0,
/// so the ranks' sequences agree even where their logits differ in the last bit.
template <class E, CachedLanguageModel M>
std::vector<std::int32_t> generate(E& engine, const M& model, std::span<const std::int32_t> prompt,
                                   const SamplingConfig& c) {
  return generate(
      model, prompt, c, [&engine](auto&& f) { return engine.forward(f); },
      [&engine](std::int32_t& token) {
        // As a float, the element every backend broadcasts: exact for ids below 2^24.
        POLYSHARD_CHECK(token < (1 << 24), "generate: token id ", token, " is above the 2^24 a rank can broadcast");
        float id = static_cast<float>(token);
        broadcast_host<typename E::device>(engine.communicator(), std::span<float>(&id, 1), 0);
        token = static_cast<std::int32_t>(id);
      });
}

}  // namespace polyshard
