// Tied weights: names under which a module's PyTorch state dict lists a parameter it stores
// once (GPT-2's lm_head.weight is transformer.wte.weight).
#pragma once

#include <string>
#include <vector>

#include "polyshard/nn/gpt.hpp"

namespace polyshard {

/// One tied weight: `alias` is listed in the state dict with the values of parameter `source`.
struct TiedParameter {
  std::string alias;
  std::string source;
};

/// Tied weights of a module type; none by default. Specialize for a module that reuses a
/// parameter under a second name, with `static std::vector<TiedParameter> of(const M&)`.
template <class M>
struct tied_parameters {
  static std::vector<TiedParameter> of(const M&) { return {}; }
};

/// GPT-2's language-model head is the token embedding: PyTorch's GPT2LMHeadModel (and
/// nanoGPT's GPT) list it in state_dict() as "lm_head.weight".
template <FloatElement T, Device D>
struct tied_parameters<Gpt<T, D>> {
  static std::vector<TiedParameter> of(const Gpt<T, D>&) { return {{"lm_head.weight", "transformer.wte.weight"}}; }
};

}  // namespace polyshard
