// The model contract of docs/models.md, checked when an Engine is named: each rule that the
// types decide fails to compile with a sentence naming the rule, and the compiler's
// instantiation note names the types (the offending member and the module that declares it, or
// the policy and the name it was given).
#pragma once

#include <tuple>
#include <type_traits>

#include "polyshard/nn/member_types.hpp"
#include "polyshard/nn/module_hooks.hpp"
#include "polyshard/policy/wrap.hpp"

namespace polyshard {

namespace contract {

/// Rule 1 and 2 for one reflected member X of module Owner, in a model computing in T on D.
template <class X, class Owner, FloatElement T, Device D>
consteval bool member_is_parameter_or_module() {
  if constexpr (detail::is_parameter<X>::value) {
    static_assert(std::is_same_v<X, Parameter<T, D>>,
                  "model contract: every parameter of the model is of its element type on its device (Parameter<float> "
                  "in a host model; Parameter<T, D> in a model whose element_type is T and device_type D): the engine "
                  "binds them all to buffers of that one type (docs/models.md, rule 2)");
    return std::is_same_v<X, Parameter<T, D>>;
  } else if constexpr (detail::is_buffer<X>::value) {
    static_assert(std::is_same_v<typename detail::is_buffer<X>::device, D>,
                  "model contract: every buffer of the model lives on its device (Buffer<E> in a host model; "
                  "Buffer<E, D> in a model whose device_type is D), any element type E (docs/models.md, rule 2)");
    return true;
  } else {
    static_assert(Module<X>,
                  "model contract: every member BOOST_HANA_DEFINE_STRUCT declares is a Parameter, a Buffer, a module or a "
                  "std::vector of modules; keep other members (a config, a flag) out of the reflected list "
                  "(docs/models.md, rule 1)");
    return Module<X>;
  }
}

/// Rule 4 for a module X that policy P names (to wrap or to checkpoint).
template <class X, class P, FloatElement T, Device D>
consteval bool named_module_maps_activations() {
  static_assert(ActivationModule<X, T, D>,
                "model contract: a module that the wrap or checkpointing policy names must map an activation to an "
                "activation (Var<T, D> to Var<T, D>, called through call()): an Embedding takes token ids and stays "
                "in the unit around it (docs/models.md, rule 4)");
  return ActivationModule<X, T, D>;
}

/// Whether `P::template wraps_type<X>` (a wrap policy) or `P::template checkpoints_type<X>`.
template <class P, class X>
consteval bool names_type() {
  if constexpr (WrapPolicy<P>) return P::template wraps_type<X>;
  else return P::template checkpoints_type<X>;
}

/// A policy given one name (WrapByType<Foo>, one of P::each_name) must find it in the model.
template <class One, class Model>
consteval bool name_is_found() {
  constexpr bool found = names_type<One, Model>() || count_member_types<Model>([]<class X, class>() {
                                                       if constexpr (Module<X>) return names_type<One, X>();
                                                       else return false;
                                                     }) > 0;
  static_assert(found,
                "model contract: the wrap or checkpointing policy names a module type that the model does not "
                "contain, so it would act on nothing: check the name (WrapByType and ActivationCheckpointing take "
                "class templates over the element type, WrapByClass and ActivationCheckpointingByClass classes)");
  return found;
}

/// Every name of a policy with `each_name` is found, and every module it names is an activation
/// module (the model itself excepted: the root is a unit whatever it computes).
template <class P, class Model, FloatElement T, Device D>
consteval bool policy_names_fit() {
  if constexpr (requires { typename P::each_name; }) {
    const bool found = []<class... One>(std::tuple<One...>*) {
      return (name_is_found<One, Model>() && ...);
    }(static_cast<typename P::each_name*>(nullptr));
    const int misnamed = count_member_types<Model>([]<class X, class>() {
      if constexpr (Module<X> && !detail::is_parameter<X>::value) {
        if constexpr (names_type<P, X>()) return !named_module_maps_activations<X, P, T, D>();
      }
      return false;
    });
    return found && misnamed == 0;
  } else {
    return true;
  }
}

}  // namespace contract

/// True when `Model`, computing in T on D, keeps the contract of docs/models.md in what its types
/// decide; otherwise it does not compile, with the broken rule's sentence.
template <class Model, class Wrap, class Checkpointing, FloatElement T, Device D>
consteval bool keeps_model_contract() {
  static_assert(Module<Model>,
                "model contract: the engine's model is a module, a struct whose members BOOST_HANA_DEFINE_STRUCT "
                "declares (docs/models.md, rule 1)");
  if constexpr (!Module<Model>) {
    return false;
  } else {
    constexpr int bad_members = count_member_types<Model>([]<class X, class Owner>() {
      return !contract::member_is_parameter_or_module<X, Owner, T, D>();
    });
    if constexpr (bad_members > 0) return false;  // one sentence is enough
    else
      return contract::policy_names_fit<Wrap, Model, T, D>() && contract::policy_names_fit<Checkpointing, Model, T, D>();
  }
}

}  // namespace polyshard
