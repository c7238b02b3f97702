// ShardingPolicy: which model state each rank holds 1/N of. Each member refines the one before:
// sharding gradients implies sharding optimizer state, sharding parameters implies both.
#pragma once

#include "polyshard/policy/family.hpp"

namespace polyshard {

/// Required members of a ShardingPolicy:
///   using family = sharding_family;
///   static constexpr bool shards_optimizer_state, shards_gradients, shards_parameters;
///   static constexpr bool reshard_after_forward;  // free gathered parameters after forward
///   static constexpr bool hybrid;                 // shard within a group, replicate across
///   static constexpr const char* name;
template <class P>
concept ShardingPolicy = PolicyOf<P, sharding_family> && requires {
  { P::shards_optimizer_state } -> std::convertible_to<bool>;
  { P::shards_gradients } -> std::convertible_to<bool>;
  { P::shards_parameters } -> std::convertible_to<bool>;
  { P::reshard_after_forward } -> std::convertible_to<bool>;
  { P::hybrid } -> std::convertible_to<bool>;
};

/// DDP: every rank holds everything; gradients are all-reduced in buckets.
struct NoShard {
  using family = sharding_family;
  static constexpr bool shards_optimizer_state = false;
  static constexpr bool shards_gradients = false;
  static constexpr bool shards_parameters = false;
  static constexpr bool reshard_after_forward = false;
  static constexpr bool hybrid = false;
  static constexpr const char* name = "NoShard";
};

/// ZeRO-1 and FairScale's OSS: each rank keeps the optimizer state (and fp32 master weights)
/// of its 1/N of the parameters, updates that part, and all-gathers the updated parameters.
struct ShardOptimizerState : NoShard {
  static constexpr bool shards_optimizer_state = true;
  static constexpr const char* name = "ShardOptimizerState";
};

/// ZeRO-2 and FairScale's OSS with ShardedDataParallel: gradients are reduce-scattered, so each
/// rank keeps only the gradients of the part it updates.
struct ShardGradients : ShardOptimizerState {
  static constexpr bool shards_gradients = true;
  static constexpr const char* name = "ShardGradients";
};

/// ZeRO-3 and FSDP: parameters too are held as shards and gathered unit by unit for compute.
/// `ReshardAfterForward` false keeps a unit gathered from its forward to its backward (FSDP's
/// SHARD_GRAD_OP), trading memory for one all-gather less per unit.
template <bool ReshardAfterForward = true>
struct ShardParameters : ShardGradients {
  static constexpr bool shards_parameters = true;
  static constexpr bool reshard_after_forward = ReshardAfterForward;
  static constexpr const char* name = ReshardAfterForward ? "ShardParameters" : "ShardParameters<false>";
};

/// Shards as `Inner` does within each group of ranks (a node, typically), and replicates across
/// groups: gradients are reduced inside the group, then all-reduced across groups.
template <class Inner>
struct HybridShard : Inner {
  static_assert(ShardingPolicy<Inner>, "HybridShard<Inner> requires 'Inner' to be a ShardingPolicy");
  static_assert(!Inner::hybrid, "HybridShard<HybridShard<...>> nests hybrid sharding, which means nothing");
  static_assert(Inner::shards_optimizer_state,
                "HybridShard<NoShard> shards nothing within a group: use NoShard (DDP) instead");
  using inner = Inner;
  static constexpr bool hybrid = true;
  static constexpr const char* name = "HybridShard";
};

}  // namespace polyshard
