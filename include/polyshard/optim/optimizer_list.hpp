// OptimizerList: several optimizers in one engine, each over the parameters it selects by name,
// as FairScale's ShardedDataParallel takes a list of OSS, each its own optimizer class and
// hyperparameters over its own parameters (with AnyOptimizer as the engine's optimizer type the
// entries may be SGD, Adam and AdamW side by side).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace polyshard {

/// Which parameters an optimizer of the list steps: a predicate on their names, PyTorch's
/// dotted names ("transformer.h.0.attn.c_attn.weight").
using ParameterSelector = std::function<bool(std::string_view name)>;

/// Every parameter.
inline ParameterSelector every_parameter() {
  return [](std::string_view) { return true; };
}

/// The parameters whose names start with one of `prefixes` ("transformer.h.0." selects the
/// first block's, "lm_head." the head's).
inline ParameterSelector names_starting_with(std::vector<std::string> prefixes) {
  return [prefixes = std::move(prefixes)](std::string_view name) {
    for (const std::string& p : prefixes)
      if (name.starts_with(p)) return true;
    return false;
  };
}

/// One optimizer of a list: its config (an optimizer's hyperparameters, or for AnyOptimizer
/// which optimizer too) over the parameters `selects` names.
template <class Config>
struct OptimizerFor {
  ParameterSelector selects;
  Config config;
};

/// The optimizers of an engine, in order: each parameter is stepped by the first that selects
/// it, and one the list leaves out is an error, frozen or not (refresh_trainable may thaw it).
/// Engine::step(lr) takes the learning rate of the first; every other's is its configured lr
/// scaled as the first's is (lr / the first's configured lr), as one schedule scales the base
/// learning rates of several parameter groups.
template <class Config>
using OptimizerList = std::vector<OptimizerFor<Config>>;

}  // namespace polyshard
