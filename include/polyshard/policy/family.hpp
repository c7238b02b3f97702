// Policy families: every policy names the family it belongs to, so Strategy<...> can sort
// policies given in any order and reject what is not a policy.
#pragma once

#include <concepts>

namespace polyshard {

/// Which of parameters, gradients and optimizer state each rank holds whole or 1/N of.
struct sharding_family {};
/// Where model state lives between steps and who runs the optimizer.
struct offload_family {};
/// Dtypes of compute, gradient reduction and master weights; loss scaling.
struct precision_family {};
/// How the module tree is cut into units that are gathered, freed and reduced as one buffer.
struct wrap_family {};
/// Which blocks recompute their activations in backward instead of keeping them.
struct checkpointing_family {};
/// Which reference document's defaults fill the StrategyConfig settings a user leaves unset.
struct defaults_family {};

/// A policy of family F: a type declaring `using family = F;`.
template <class P, class F>
concept PolicyOf = requires { typename P::family; } && std::same_as<typename P::family, F>;

/// Any policy of the six families.
template <class P>
concept Policy = PolicyOf<P, sharding_family> || PolicyOf<P, offload_family> || PolicyOf<P, precision_family> ||
                 PolicyOf<P, wrap_family> || PolicyOf<P, checkpointing_family> || PolicyOf<P, defaults_family>;

}  // namespace polyshard
