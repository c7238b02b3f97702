// The units a strategy makes of a GPT and their padding, worked out from the model's parameter
// shapes and the strategy's rules alone, never read from the engine: the memory and traffic
// tests predict with these and check the engine's layout against them, so that a unit padded
// more than its strategy requires fails.
#pragma once

#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "polyshard/nn/gpt.hpp"
#include "polyshard/policy/wrap.hpp"

namespace polyshard::test {

/// The elements of each parameter tensor of a GPT of `c` (C channels, V tokens, T positions), in
/// no particular order: the root's (wte, wpe, ln_f's weight and bias) and a block's (ln_1,
/// attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj: weight and bias each).
struct GptShapes {
  std::vector<std::int64_t> root, block;
  std::int64_t blocks = 0;
};

inline GptShapes gpt_shapes(const GptConfig& c) {
  const std::int64_t C = c.n_embd, V = c.vocab_size, T = c.block_size;
  return {{V * C, T * C, C, C},
          {C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C},
          c.n_layer};
}

inline std::int64_t sum(const std::vector<std::int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), std::int64_t{0});
}

/// The parameters of each unit S's wrap policy makes, root first, in forward order:
/// WrapByType<Block> makes the root and each block a unit, as WrapRepeated does with blocks of at
/// least its threshold; the wrap policies the tests use otherwise make one unit of everything
/// (WrapBySize's default threshold, 1e8, is above these models).
template <class S>
std::vector<std::vector<std::int64_t>> unit_parameters(const GptShapes& shapes) {
  using W = typename S::wrap;
  static_assert(!W::manual && (W::min_num_params == 0 || W::min_num_params >= 100'000'000),
                "unit_parameters: a wrap policy that cuts these models by size or by hand is not worked out here");
  const bool by_block = std::is_same_v<W, WrapByType<Block>> ||
                        (W::repeated_min_num_params > 0 && sum(shapes.block) >= W::repeated_min_num_params);
  std::vector<std::vector<std::int64_t>> units{shapes.root};
  for (std::int64_t b = 0; b < shapes.blocks; ++b) {
    if (by_block) units.push_back(shapes.block);
    else units.front().insert(units.front().end(), shapes.block.begin(), shapes.block.end());
  }
  return units;
}

/// Each unit's elements padded to a multiple of the world size, ceil(n / W) W, so that it splits
/// into W equal shards. NoShard too, which needs no shards: at most W - 1 elements a unit, kept
/// so that every policy lays units out alike.
template <class S>
std::vector<std::int64_t> padded_units(const GptShapes& shapes, int world) {
  std::vector<std::int64_t> out;
  for (const auto& params : unit_parameters<S>(shapes)) {
    const std::int64_t n = sum(params);
    out.push_back((n + world - 1) / world * world);
  }
  return out;
}

}  // namespace polyshard::test
