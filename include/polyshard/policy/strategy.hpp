// Strategy<Ps...>: a training strategy composed of one policy per family, given in any order;
// families left out take their defaults, and compositions that make no sense do not compile.
#pragma once

#include <boost/hana/count_if.hpp>
#include <boost/hana/find_if.hpp>
#include <boost/hana/optional.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <type_traits>

#include "polyshard/policy/defaults.hpp"
#include "polyshard/policy/offload.hpp"
#include "polyshard/policy/precision.hpp"
#include "polyshard/policy/sharding.hpp"
#include "polyshard/policy/wrap.hpp"

namespace polyshard {

namespace detail {
template <class F>
constexpr auto in_family = [](auto t) {
  using P = typename decltype(t)::type;
  return boost::hana::bool_c<PolicyOf<P, F>>;
};

/// The policy of family F among Ps, or Default when none is.
template <class F, class Default, class... Ps>
using pick_t = typename std::remove_cvref_t<decltype(boost::hana::find_if(boost::hana::tuple_t<Ps...>, in_family<F>)
                                      .value_or(boost::hana::type_c<Default>))>::type;

template <class F, class... Ps>
constexpr std::size_t count_family = decltype(boost::hana::count_if(boost::hana::tuple_t<Ps...>, in_family<F>))::value;
}  // namespace detail

/// A strategy type. Families and defaults:
///   ShardingPolicy         NoShard                     (DDP)
///   OffloadPolicy          NoOffload
///   PrecisionPolicy        Fp32
///   WrapPolicy             WrapWhole
///   ActivationCheckpointing NoActivationCheckpointing
///   DefaultsPolicy         TorchDefaults               (what unset StrategyConfig settings mean)
/// `with<P>` is the same strategy with P in place of its family's member.
template <class... Ps>
struct Strategy {
  static_assert((Policy<Ps> && ...),
                "Strategy<Ps...>: every argument must be a policy (a ShardingPolicy, OffloadPolicy, "
                "PrecisionPolicy, WrapPolicy, ActivationCheckpointing or DefaultsPolicy)");
  static_assert(detail::count_family<sharding_family, Ps...> <= 1,
                "Strategy<Ps...>: two sharding policies given; a strategy has one ShardingPolicy");
  static_assert(detail::count_family<offload_family, Ps...> <= 1,
                "Strategy<Ps...>: two offload policies given; a strategy has one OffloadPolicy");
  static_assert(detail::count_family<precision_family, Ps...> <= 1,
                "Strategy<Ps...>: two precision policies given; a strategy has one PrecisionPolicy");
  static_assert(detail::count_family<wrap_family, Ps...> <= 1,
                "Strategy<Ps...>: two wrap policies given; a strategy has one WrapPolicy");
  static_assert(detail::count_family<checkpointing_family, Ps...> <= 1,
                "Strategy<Ps...>: two activation-checkpointing policies given; a strategy has at most one");
  static_assert(detail::count_family<defaults_family, Ps...> <= 1,
                "Strategy<Ps...>: two defaults policies given; a strategy follows one reference's defaults");

  using sharding = detail::pick_t<sharding_family, NoShard, Ps...>;
  using offload = detail::pick_t<offload_family, NoOffload, Ps...>;
  using precision = detail::pick_t<precision_family, Fp32, Ps...>;
  using wrap = detail::pick_t<wrap_family, WrapWhole, Ps...>;
  using checkpointing = detail::pick_t<checkpointing_family, NoActivationCheckpointing, Ps...>;
  using defaults = detail::pick_t<defaults_family, TorchDefaults, Ps...>;

  static_assert(ShardingPolicy<sharding>, "Strategy: the sharding policy lacks a ShardingPolicy's members");
  static_assert(OffloadPolicy<offload>, "Strategy: the offload policy lacks an OffloadPolicy's members");
  static_assert(PrecisionPolicy<precision>, "Strategy: the precision policy lacks a PrecisionPolicy's members");
  static_assert(WrapPolicy<wrap>, "Strategy: the wrap policy lacks a WrapPolicy's members");
  static_assert(DefaultsPolicy<defaults>, "Strategy: the defaults policy lacks a DefaultsPolicy's members");

  static_assert(!offload::offloads_parameters || sharding::shards_parameters,
                "offloading parameters needs ShardParameters: only parameter shards can live off the device "
                "between uses (FSDP cpu_offload, ZeRO-3 offload_parameters)");
  static_assert(!offload::offloads_optimizer || sharding::shards_optimizer_state,
                "offloading the optimizer needs a sharded optimizer (ShardOptimizerState, ShardGradients or "
                "ShardParameters): ZeRO-Offload moves each rank's shard of the optimizer, and DDP has none");
  static_assert(!offload::to_nvme || sharding::shards_parameters,
                "offloading to NVMe needs ShardParameters: ZeRO-Infinity is ZeRO stage 3 with NVMe offload");

  using compute_type = typename precision::compute_type;
  using reduce_type = typename precision::reduce_type;
  using master_type = typename precision::master_type;

  template <class P>
  using with = Strategy<std::conditional_t<PolicyOf<P, sharding_family>, P, sharding>,
                        std::conditional_t<PolicyOf<P, offload_family>, P, offload>,
                        std::conditional_t<PolicyOf<P, precision_family>, P, precision>,
                        std::conditional_t<PolicyOf<P, wrap_family>, P, wrap>,
                        std::conditional_t<PolicyOf<P, checkpointing_family>, P, checkpointing>,
                        std::conditional_t<PolicyOf<P, defaults_family>, P, defaults>>;
};

namespace detail {
template <class S>
struct is_strategy : std::false_type {};
template <class... Ps>
struct is_strategy<Strategy<Ps...>> : std::true_type {};
}  // namespace detail

/// A Strategy<...> instantiation.
template <class S>
concept StrategyType = detail::is_strategy<S>::value;

/// The same strategy with P in place of its family's member.
template <StrategyType S, Policy P>
using with_t = typename S::template with<P>;

/// The strategy S in one spelling: the policies of its five families that decide the code, in
/// the order above, the defaults written out. Strategies that name the same policies (in any
/// order, defaults given or left out) have the same canonical_t; the engine is instantiated over
/// it once for all of them. The defaults policy is left out: it only fills the config, which
/// Engine does before the engine reads it, so ShardedDDP and ZeRO<2> share one engine.
template <StrategyType S>
using canonical_t = Strategy<typename S::sharding, typename S::offload, typename S::precision, typename S::wrap,
                             typename S::checkpointing>;

}  // namespace polyshard
