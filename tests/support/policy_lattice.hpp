// The lattice of policy compositions the tests draw from: every member of each family, and a
// constexpr predicate that says which compositions compile (mirroring the static_asserts of
// Strategy, HybridShard and the engine's offload placements, sentence by sentence). The
// covering subset drawn from it is in policy_covering.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "polyshard/nn/block.hpp"
#include "polyshard/policy/policy.hpp"

namespace polyshard::test::lattice {

/// A list of types that is never instantiated as a whole: HybridShard<NoShard> may be named in it
/// without its static_asserts firing.
template <class... Ts>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ts);
};

template <std::size_t I, class List>
struct at;
template <std::size_t I, class T, class... Ts>
struct at<I, type_list<T, Ts...>> : at<I - 1, type_list<Ts...>> {};
template <class T, class... Ts>
struct at<0, type_list<T, Ts...>> {
  using type = T;
};
template <std::size_t I, class List>
using at_t = typename at<I, List>::type;

/// WrapBySize's threshold for the oracle's test model (tests/engine/oracle_fixture.hpp): its
/// blocks (2,197 parameters) become units, their MLPs (1,417) do not.
inline constexpr std::int64_t kWrapThreshold = 1500;

/// The members of each family: the library's policies, HybridShard over each sharding policy.
using Shardings = type_list<NoShard, ShardOptimizerState, ShardGradients, ShardParameters<true>, ShardParameters<false>,
                            HybridShard<NoShard>, HybridShard<ShardOptimizerState>, HybridShard<ShardGradients>,
                            HybridShard<ShardParameters<true>>, HybridShard<ShardParameters<false>>>;
using Offloads = type_list<NoOffload, OffloadOptimizer<Cpu>, OffloadOptimizer<Nvme>, OffloadParameters<Cpu>,
                           OffloadParameters<Nvme>, OffloadParametersOnly<Cpu>>;
using Precisions = type_list<Fp32, Fp16Mixed, Bf16Mixed, PureBf16>;
using Wraps = type_list<WrapWhole, WrapBySize<kWrapThreshold>, WrapByType<Block>, ManualWrap>;
using Checkpointings = type_list<NoActivationCheckpointing, ActivationCheckpointing<Block>>;

inline constexpr std::size_t kFamilies = 5;
inline constexpr std::array<std::size_t, kFamilies> kSizes{Shardings::size, Offloads::size, Precisions::size,
                                                           Wraps::size, Checkpointings::size};
inline constexpr std::size_t kCompositions =
    Shardings::size * Offloads::size * Precisions::size * Wraps::size * Checkpointings::size;
inline constexpr std::array<std::string_view, kFamilies> kFamilyNames{"sharding", "offload", "precision", "wrap",
                                                                      "activation checkpointing"};

/// Composition k's member index in each family (the last family varies fastest).
constexpr std::array<std::size_t, kFamilies> members_of(std::size_t k) {
  std::array<std::size_t, kFamilies> m{};
  for (std::size_t f = kFamilies; f-- > 0;) {
    m[f] = k % kSizes[f];
    k /= kSizes[f];
  }
  return m;
}

namespace detail {
/// What a sharding member shards, read without instantiating HybridShard<Inner> (whose
/// static_asserts would stop the compilation the predicate is there to foresee).
template <class Sh>
struct sharding_facts {
  static constexpr bool hybrid_of_hybrid = false, hybrid_of_nothing = false;
  static constexpr bool optimizer = Sh::shards_optimizer_state, parameters = Sh::shards_parameters;
};
template <class Inner>
struct sharding_facts<HybridShard<Inner>> {
  static constexpr bool hybrid_of_hybrid = Inner::hybrid, hybrid_of_nothing = !Inner::shards_optimizer_state;
  static constexpr bool optimizer = Inner::shards_optimizer_state, parameters = Inner::shards_parameters;
};
}  // namespace detail

/// Whether this build compiles NVMe offload (polyshard's CMake target defines the macro where it
/// finds liburing).
#ifdef POLYSHARD_HAVE_LIBURING
inline constexpr bool kHaveLiburing = true;
#else
inline constexpr bool kHaveLiburing = false;
#endif

/// Empty when Strategy<Sh, Off, Pr, Wr, Ck> compiles and an Engine over it instantiates; else
/// (part of) the sentence of the first static_assert that stops it, in the order the compiler
/// meets them. Mirrors, and must be kept in step with: HybridShard (policy/sharding.hpp), the
/// offload checks of Strategy (policy/strategy.hpp) and OffloadPlacement
/// (engine/offload/nvme_*.hpp); tests/fail/lattice checks each sentence on samples.
template <class Sh, class Off, class Pr, class Wr, class Ck>
constexpr std::string_view composition_error() {
  using S = detail::sharding_facts<Sh>;
  if (S::hybrid_of_hybrid) return "HybridShard<HybridShard<...>> nests hybrid sharding, which means nothing";
  if (S::hybrid_of_nothing) return "HybridShard<NoShard> shards nothing within a group: use NoShard (DDP) instead";
  if (Off::offloads_parameters && !S::parameters) return "offloading parameters needs ShardParameters";
  if (Off::offloads_optimizer && !S::optimizer) return "offloading the optimizer needs a sharded optimizer";
  if (Off::to_nvme && !S::parameters) return "offloading to NVMe needs ShardParameters";
  if (Off::to_nvme && !kHaveLiburing)
    return Off::offloads_parameters ? "OffloadParameters<Nvme> (ZeRO-Infinity) needs liburing"
                                    : "OffloadOptimizer<Nvme> (ZeRO-Infinity) needs liburing";
  return {};
}

/// The member types of composition K.
template <std::size_t K>
struct composition {
  static constexpr std::array<std::size_t, kFamilies> m = members_of(K);
  using sharding = at_t<m[0], Shardings>;
  using offload = at_t<m[1], Offloads>;
  using precision = at_t<m[2], Precisions>;
  using wrap = at_t<m[3], Wraps>;
  using checkpointing = at_t<m[4], Checkpointings>;
  static constexpr std::string_view error = composition_error<sharding, offload, precision, wrap, checkpointing>();
  static constexpr bool valid = error.empty();
};

/// Composition K as a Strategy (only for valid K: an invalid one stops the compilation).
template <std::size_t K>
using strategy_t = Strategy<typename composition<K>::sharding, typename composition<K>::offload,
                            typename composition<K>::precision, typename composition<K>::wrap,
                            typename composition<K>::checkpointing>;

/// Composition K as it would be written: "Strategy<ShardGradients, OffloadOptimizer<Cpu>, ...>".
template <std::size_t K>
std::string composition_name() {
  using C = composition<K>;
  std::string sharding;
  if constexpr (requires { typename C::sharding::inner; })
    sharding = "HybridShard<" + std::string(C::sharding::inner::name) + ">";
  else
    sharding = C::sharding::name;
  std::string wrap = C::wrap::name;
  if constexpr (C::wrap::min_num_params > 0) wrap += "<" + std::to_string(C::wrap::min_num_params) + ">";
  if constexpr (std::is_same_v<typename C::wrap, WrapByType<Block>>) wrap += "<Block>";
  std::string checkpointing = C::checkpointing::name;
  if constexpr (std::is_same_v<typename C::checkpointing, ActivationCheckpointing<Block>>) checkpointing += "<Block>";
  return "Strategy<" + sharding + ", " + C::offload::name + ", " + C::precision::name + ", " + wrap + ", " +
         checkpointing + ">";
}

}  // namespace polyshard::test::lattice
