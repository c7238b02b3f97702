// DefaultsPolicy: whose defaults a strategy's unset StrategyConfig settings take. One config
// struct serves every strategy, but the references disagree on what a run does when nothing is
// set: PyTorch's DDP and FairScale's FSDP cut gradient buckets of bucket_cap_mb's 25 MiB,
// FairScale's ShardedDataParallel of reduce_buffer_size's 2^23 elements, DeepSpeed of
// reduce_bucket_size's 2e8 elements; and where the optimizer state alone is sharded, FairScale's
// OSS gives each parameter whole to one rank where DeepSpeed slices the flat buffer evenly. The
// presets name their reference's policy; Engine applies it (with_reference_defaults) before the
// engine reads the config.
#pragma once

#include <concepts>

#include "polyshard/policy/config.hpp"
#include "polyshard/policy/family.hpp"

namespace polyshard {

/// A defaults policy:
///   using family = defaults_family;
///   static constexpr const char* name;
///   static void fill_bucket_cap(StrategyConfig&);  // sets its reference's gradient-bucket cap
///   static constexpr ShardPartition partition;      // its reference's shards of optimizer state
template <class P>
concept DefaultsPolicy = PolicyOf<P, defaults_family> && requires(StrategyConfig& c) {
  { P::name } -> std::convertible_to<const char*>;
  P::fill_bucket_cap(c);
  { P::partition } -> std::convertible_to<ShardPartition>;
};

/// PyTorch's DistributedDataParallel and FairScale's FullyShardedDataParallel: buckets of
/// bucket_cap_mb = 25 MiB of the reduce type; FSDP's flat parameters are even slices. The
/// default of the family.
struct TorchDefaults {
  using family = defaults_family;
  static constexpr const char* name = "TorchDefaults";
  static void fill_bucket_cap(StrategyConfig& c) { c.bucket_cap_mb = torch_bucket_cap_mb; }
  static constexpr ShardPartition partition = ShardPartition::flat_slices;
};

/// FairScale's ShardedDataParallel: reduce_buffer_size = 2^23 elements batch the small
/// parameters, larger ones are reduced alone; its OSS gives each parameter whole to one rank.
struct FairScaleShardedDefaults {
  using family = defaults_family;
  static constexpr const char* name = "FairScaleShardedDefaults";
  static void fill_bucket_cap(StrategyConfig& c) { c.reduce_buffer_size = fairscale_reduce_buffer_size; }
  static constexpr ShardPartition partition = ShardPartition::whole_parameters;
};

/// DeepSpeed as Lightning's DeepSpeedStrategy configures it: reduce_bucket_size = 2e8 elements,
/// so that a model of fewer elements is one bucket a unit, reduced when its backward is done;
/// stages 1 and 2 shard even slices of the flat buffer.
struct DeepSpeedDefaults {
  using family = defaults_family;
  static constexpr const char* name = "DeepSpeedDefaults";
  static void fill_bucket_cap(StrategyConfig& c) { c.reduce_bucket_size = lightning_reduce_bucket_size; }
  static constexpr ShardPartition partition = ShardPartition::flat_slices;
};

/// Whether `config` sets any of the three gradient-bucket caps (bucket_cap_mb,
/// reduce_bucket_size, reduce_buffer_size); where it sets none, a reference's cap applies.
inline bool sets_bucket_cap(const StrategyConfig& config) {
  return config.bucket_cap_mb || config.reduce_bucket_size || config.reduce_buffer_size;
}

/// Fills in the settings `config` leaves unset from defaults policy P, for a strategy sharding as
/// `Sharding` does: where it sets no gradient-bucket cap, P's; where it sets no partition and
/// Sharding shards the optimizer state of whole parameters, P's partition. A cap the user sets
/// replaces the reference's rather than adding to it, so a run configured for one reference
/// buckets the same under every strategy.
template <class Sharding, DefaultsPolicy P>
void fill_reference_defaults(StrategyConfig& config) {
  if (!sets_bucket_cap(config)) P::fill_bucket_cap(config);
  if constexpr (Sharding::shards_optimizer_state && !Sharding::shards_parameters)
    if (!config.partition) config.partition = P::partition;
}

/// `config` with the settings it leaves unset taken from strategy S's reference (its
/// DefaultsPolicy, fill_reference_defaults).
template <class S>
StrategyConfig with_reference_defaults(StrategyConfig config) {
  fill_reference_defaults<typename S::sharding, typename S::defaults>(config);
  return config;
}

}  // namespace polyshard
