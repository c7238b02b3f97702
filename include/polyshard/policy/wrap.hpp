// WrapPolicy: how the module tree is cut into units, each gathered, freed and reduced as one
// flat buffer; and ActivationCheckpointing: which blocks recompute their activations.
#pragma once

#include <cstdint>
#include <tuple>
#include <type_traits>

#include "polyshard/core/device.hpp"
#include "polyshard/policy/family.hpp"

namespace polyshard {

/// Required members of a WrapPolicy:
///   using family = wrap_family;
///   template <class M> static constexpr bool wraps_type;  // M's instances are units of their own
///   static constexpr std::int64_t min_num_params;         // subtrees this large are units (0: off)
///   static constexpr bool manual;                          // units declared by wrap() calls
/// and optionally (WrapWhole gives 0):
///   static constexpr std::int64_t repeated_min_num_params; // repeated modules this large are units
template <class P>
concept WrapPolicy = PolicyOf<P, wrap_family> && requires {
  { P::min_num_params } -> std::convertible_to<std::int64_t>;
  { P::manual } -> std::convertible_to<bool>;
};

/// The whole model is one unit.
struct WrapWhole {
  using family = wrap_family;
  template <class M>
  static constexpr bool wraps_type = false;
  static constexpr std::int64_t min_num_params = 0;
  static constexpr bool manual = false;
  static constexpr std::int64_t repeated_min_num_params = 0;
  static constexpr const char* name = "WrapWhole";
};

/// ZeRO stage 3's granularity, for any model: every module held in a std::vector member (the
/// repeated layers of a transformer: Gpt's `h`, examples/08-own-model's `layers`) is a unit of
/// its own when it holds at least `MinNumParams` parameters outside the units inside it. The
/// default, 1e5, is DeepSpeed's stage3_param_persistence_threshold: what is smaller stays whole
/// on every rank (here: in the root unit), as DeepSpeed keeps small parameters unpartitioned.
/// A rank then holds the root and the units in flight, not the whole model. Modules that do not
/// map an activation to an activation (see ActivationModule) cannot be units and stay where
/// they are.
template <std::int64_t MinNumParams = 100'000>
struct WrapRepeated : WrapWhole {
  static_assert(MinNumParams >= 1, "WrapRepeated<min_num_params>: min_num_params must be at least 1");
  static constexpr std::int64_t repeated_min_num_params = MinNumParams;
  static constexpr const char* name = "WrapRepeated";
};

/// FairScale's auto_wrap: every submodule with at least `MinNumParams` parameters not already in
/// a smaller unit becomes a unit (default 1e8, as in the FairScale strategy).
template <std::int64_t MinNumParams = 100'000'000>
struct WrapBySize : WrapWhole {
  static_assert(MinNumParams >= 1, "WrapBySize<min_num_params>: min_num_params must be at least 1");
  static constexpr std::int64_t min_num_params = MinNumParams;
  static constexpr const char* name = "WrapBySize";
};

/// Transformer auto-wrap: every instance of one of the module templates `Ms` (for example
/// Block) is a unit of its own. For a plain struct, use WrapByClass.
template <template <class> class... Ms>
struct WrapByType : WrapWhole {
  static_assert(sizeof...(Ms) >= 1, "WrapByType<Ms...>: name at least one module type to wrap");
  template <class M>
  struct matches : std::false_type {};
  template <template <class> class M, class T>
  struct matches<M<T>> : std::bool_constant<(std::is_same_v<M<T>, Ms<T>> || ...)> {};
  // Modules over an element type and a device (Block<T, D>): Ms<T> names the host instance,
  // the same template whatever the device.
  template <template <class, class> class M, class T, class D>
  struct matches<M<T, D>> : std::bool_constant<(std::is_same_v<M<T, Cpu>, Ms<T>> || ...)> {};
  template <class M>
  static constexpr bool wraps_type = matches<M>::value;
  /// One policy per name, for the check that each name matches a module of the model.
  using each_name = std::tuple<WrapByType<Ms>...>;
  static constexpr const char* name = "WrapByType";
};

/// Every instance of one of the module classes `Ms` is a unit of its own: plain structs
/// (WrapByClass<Head>) or instances of class templates (WrapByClass<Residual<float>>). C++ takes
/// classes and class templates in different parameter lists, hence WrapByType beside it.
template <class... Ms>
struct WrapByClass : WrapWhole {
  static_assert(sizeof...(Ms) >= 1, "WrapByClass<Ms...>: name at least one module class to wrap");
  template <class M>
  static constexpr bool wraps_type = (std::is_same_v<M, Ms> || ...);
  using each_name = std::tuple<WrapByClass<Ms>...>;
  static constexpr const char* name = "WrapByClass";
};

/// FairScale's manual wrapping: the units are the modules marked with wrap(module) in the
/// ShardedConstruction context installed on the thread that builds the engine, plus the root
/// (see engine/sharded_construction.hpp). Building a ManualWrap engine outside a context, or
/// with no marks, throws.
struct ManualWrap : WrapWhole {
  static constexpr bool manual = true;
  static constexpr const char* name = "ManualWrap";
};

/// Required members of an ActivationCheckpointing policy:
///   using family = checkpointing_family;
///   template <class M> static constexpr bool checkpoints_type;
template <class P>
concept CheckpointingPolicy = PolicyOf<P, checkpointing_family>;

/// Every activation is kept for backward.
struct NoActivationCheckpointing {
  using family = checkpointing_family;
  template <class M>
  static constexpr bool checkpoints_type = false;
  static constexpr const char* name = "NoActivationCheckpointing";
};

/// Instances of the module templates `Ms` drop their activations in forward and recompute them
/// in backward (the wrapping guide's activation_checkpointing=MyTransformerBlock).
template <template <class> class... Ms>
struct ActivationCheckpointing : NoActivationCheckpointing {
  static_assert(sizeof...(Ms) >= 1, "ActivationCheckpointing<Ms...>: name at least one module type");
  template <class M>
  static constexpr bool checkpoints_type = WrapByType<Ms...>::template wraps_type<M>;
  using each_name = std::tuple<ActivationCheckpointing<Ms>...>;
  static constexpr const char* name = "ActivationCheckpointing";
};

/// Instances of the module classes `Ms` (plain structs, or class template instances) recompute
/// their activations in backward: ActivationCheckpointing for what WrapByClass wraps.
template <class... Ms>
struct ActivationCheckpointingByClass : NoActivationCheckpointing {
  static_assert(sizeof...(Ms) >= 1, "ActivationCheckpointingByClass<Ms...>: name at least one module class");
  template <class M>
  static constexpr bool checkpoints_type = (std::is_same_v<M, Ms> || ...);
  using each_name = std::tuple<ActivationCheckpointingByClass<Ms>...>;
  static constexpr const char* name = "ActivationCheckpointingByClass";
};

}  // namespace polyshard
