// Cutting a model into units by its WrapPolicy: each unit is a set of parameters laid out in
// one flat buffer, padded to a multiple of the world size so that it splits into equal shards.
#pragma once

#include <map>
#include <set>
#include <string>
#include <typeindex>
#include <vector>

#include "polyshard/engine/sharded_construction.hpp"
#include "polyshard/nn/module_hooks.hpp"
#include "polyshard/nn/reflect.hpp"
#include "polyshard/policy/wrap.hpp"

namespace polyshard {

/// One parameter's place in its unit's flat buffer (parameters of T on D).
template <FloatElement T, Device D = Cpu>
struct UnitEntry {
  std::string name;
  std::int64_t offset;  // in elements, from the start of the unit
  Shape shape;
  ParameterInit init;
  Parameter<T, D>* parameter;
  std::size_t order = 0;  // the parameter's place among the model's, in the order it declares them
  std::size_t optimizer = 0;  // which optimizer of the engine's OptimizerList steps it
  std::int64_t numel() const { return shape.numel(); }
};

/// The layout of one unit. Unit 0 is the root: every parameter no wrapped module claims.
template <FloatElement T, Device D = Cpu>
struct UnitLayout {
  std::string name;            // the wrapped module's name ("" for the root)
  bool checkpointed = false;   // its activations are recomputed in backward
  std::vector<UnitEntry<T, D>> entries;
  std::int64_t numel = 0;      // parameters, without padding
  std::int64_t padded = 0;     // a multiple of the world size (but for uneven shards: numel)
  /// Uneven shards (ShardPartition::whole_parameters): rank r's is elements [bounds[r],
  /// bounds[r + 1]). Empty: equal shards of padded / world elements.
  std::vector<std::int64_t> bounds;

  /// Where rank `rank` of `world`'s shard starts, and its elements.
  std::int64_t shard_begin(int rank, int world) const {
    return bounds.empty() ? rank * (padded / world) : bounds[static_cast<std::size_t>(rank)];
  }
  std::int64_t shard_size(int rank, int world) const {
    return bounds.empty() ? padded / world
                          : bounds[static_cast<std::size_t>(rank) + 1] - bounds[static_cast<std::size_t>(rank)];
  }

  /// "the root unit" or "unit 'NAME'", as errors and call sites name it.
  std::string display_name() const { return name.empty() ? std::string("the root unit") : "unit '" + name + "'"; }
};

/// The units of a model and the wrapped modules, for the engine's call hooks.
template <FloatElement T, Device D = Cpu>
struct UnitPlan {
  std::vector<UnitLayout<T, D>> units;
  std::map<ModuleKey, std::size_t> unit_of_module;
  /// Modules whose activations are recomputed in backward.
  std::map<ModuleKey, bool> checkpointed_modules;
  std::int64_t padded_total() const {
    std::int64_t n = 0;
    for (const auto& u : units) n += u.padded;
    return n;
  }
  std::int64_t numel_total() const {
    std::int64_t n = 0;
    for (const auto& u : units) n += u.numel;
    return n;
  }
  /// Rank `rank`'s shard of each unit where the shards are uneven
  /// (ShardPartition::whole_parameters), for the accounting's predictions; empty where they are
  /// equal (padded / world each, which the predictions assume).
  std::vector<std::int64_t> uneven_shards(int rank, int world) const {
    std::vector<std::int64_t> out;
    if (units.empty() || units.front().bounds.empty()) return out;
    for (const auto& u : units) out.push_back(u.shard_size(rank, world));
    return out;
  }
};

namespace detail {
/// Wrap::repeated_min_num_params, or 0 for a wrap policy of the user's that does not declare it.
template <class Wrap>
constexpr std::int64_t repeated_min_num_params() {
  if constexpr (requires { Wrap::repeated_min_num_params; }) return Wrap::repeated_min_num_params;
  else return 0;
}

template <FloatElement T, Device D, class Wrap, class Checkpointing>
class UnitPlanner {
 public:
  /// `marks`: the modules wrap() marked (ManualWrap only; null otherwise).
  UnitPlanner(UnitPlan<T, D>& plan, std::int64_t min_num_params, const ShardedConstruction* marks = nullptr)
      : plan_(plan), min_num_params_(min_num_params), marks_(marks) {}

  /// The marked modules the walk met.
  const std::set<ModuleKey>& found() const { return found_; }

  /// Walks `m`, adding its parameters to unit `unit` unless `m` (or a module inside it) is
  /// wrapped. Returns the number of parameters it left in `unit` (for size-based wrapping).
  template <class M>
  std::int64_t walk(M& m, const std::string& name, std::size_t unit, bool is_root) {
    using X = std::remove_const_t<M>;
    if constexpr (is_parameter<X>::value) {
      auto& u = plan_.units[unit];
      u.entries.push_back(UnitEntry<T, D>{name, u.numel, m.shape(), m.init(), &m, declared_++});
      u.numel += m.numel();
      return m.numel();
    } else if constexpr (is_buffer<X>::value) {
      return 0;  // kept whole on every rank, outside the units
    } else if constexpr (is_vector<X>::value) {
      using E = typename X::value_type;
      std::int64_t n = 0;
      for (std::size_t i = 0; i < m.size(); ++i) {
        const std::string element = join_name(name, std::to_string(i));
        if constexpr (repeated_min_num_params<Wrap>() > 0 && ActivationModule<E, T, D>) {
          // WrapRepeated: the element is a unit when it holds enough parameters of its own.
          if constexpr (Checkpointing::template checkpoints_type<E>) plan_.checkpointed_modules[module_key(m[i])] = true;
          const std::size_t mine = plan_.units.size();
          plan_.units.push_back(
              UnitLayout<T, D>{element, plan_.checkpointed_modules.count(module_key(m[i])) > 0, {}, 0, 0, {}});
          if (walk_members(m[i], element, mine) >= repeated_min_num_params<Wrap>()) {
            plan_.unit_of_module[module_key(m[i])] = mine;
          } else {
            n += merge_back(mine, unit);
          }
        } else {
          n += walk(m[i], element, unit, false);
        }
      }
      return n;
    } else {
      constexpr bool callable = ActivationModule<X, T, D>;
      if constexpr (callable && Checkpointing::template checkpoints_type<X>) plan_.checkpointed_modules[module_key(m)] = true;
      if constexpr (callable && (Wrap::template wraps_type<X> || (Wrap::min_num_params > 0) || Wrap::manual)) {
        // ManualWrap: only the modules wrap() marked (the root is a unit already).
        const bool marked = Wrap::manual && marks_ && marks_->marked(module_key(m));
        if (marked) found_.insert(module_key(m));
        if (!is_root && (!Wrap::manual || marked)) {
          // A unit of its own, tentatively; size-based wrapping may give its parameters back.
          const std::size_t mine = plan_.units.size();
          plan_.units.push_back(
              UnitLayout<T, D>{name, plan_.checkpointed_modules.count(module_key(m)) > 0, {}, 0, 0, {}});
          const std::int64_t left = walk_members(m, name, mine);
          if (Wrap::template wraps_type<X> || marked || (min_num_params_ > 0 && left >= min_num_params_)) {
            POLYSHARD_CHECK(!marked || left > 0, "ManualWrap: wrap() marked '", name, "' (",
                            detail::readable_type_name(typeid(X)), "), which holds no parameters outside the units "
                            "inside it: there is nothing to shard; do not mark it");
            plan_.unit_of_module[module_key(m)] = mine;
            return 0;
          }
          return merge_back(mine, unit);
        }
      }
      return walk_members(m, name, unit);
    }
  }

 private:
  template <class M>
  std::int64_t walk_members(M& m, const std::string& name, std::size_t unit) {
    std::int64_t n = 0;
    boost::hana::for_each(boost::hana::accessors<std::remove_const_t<M>>(), [&](auto accessor) {
      const std::string member = boost::hana::to<const char*>(boost::hana::first(accessor));
      n += walk(boost::hana::second(accessor)(m), join_name(name, member), unit, false);
    });
    return n;
  }

  /// Moves the entries of tentative unit `from` (the last one, and any units created after it
  /// are kept) into `into`; returns how many parameters moved.
  std::int64_t merge_back(std::size_t from, std::size_t into) {
    UnitLayout<T, D> tentative = std::move(plan_.units[from]);
    plan_.units.erase(plan_.units.begin() + static_cast<std::ptrdiff_t>(from));
    // Units created inside the tentative one shifted down by one.
    for (auto& [module, index] : plan_.unit_of_module)
      if (index > from) --index;
    auto& target = plan_.units[into];
    for (auto& e : tentative.entries) {
      e.offset = target.numel;
      target.numel += e.numel();
      target.entries.push_back(std::move(e));
    }
    return tentative.numel;
  }

  UnitPlan<T, D>& plan_;
  std::int64_t min_num_params_;
  const ShardedConstruction* marks_;
  std::set<ModuleKey> found_;
  std::size_t declared_ = 0;  // parameters walked so far
};
}  // namespace detail

/// Cuts `model` into units as `Wrap` says (WrapWhole: one; WrapByType<Ms...>: one per instance
/// of Ms, plus the root; WrapBySize<n>: FairScale's auto_wrap, bottom-up, every module whose
/// not-yet-wrapped parameters number at least n; WrapRepeated<n>: every module of a std::vector
/// member whose not-yet-wrapped parameters number at least n, plus the root; ManualWrap: one per module wrap() marked in
/// this thread's ShardedConstruction context, plus the root). Only modules that map an
/// activation to an activation (see ActivationModule) can be units: they are the ones an engine
/// can surround. `min_num_params` >= 1 replaces WrapBySize's threshold at run time (FSDP's
/// option). Units are numbered in the model's declaration order, whatever the order of marks.
/// Throws polyshard::Error for ManualWrap outside a context, with no marks, or with a mark that
/// is not a module of `model`. The model's parameters are of T on D.
template <class Wrap, class Checkpointing, FloatElement T, class Model, Device D = Cpu>
UnitPlan<T, D> plan_units(Model& model, std::int64_t world_size, std::int64_t min_num_params = 0) {
  UnitPlan<T, D> plan;
  plan.units.push_back(UnitLayout<T, D>{"", false, {}, 0, 0, {}});
  const std::int64_t threshold = Wrap::min_num_params > 0 && min_num_params > 0 ? min_num_params : Wrap::min_num_params;
  const ShardedConstruction* marks = nullptr;
  if constexpr (Wrap::manual) {
    marks = ShardedConstruction::current();
    POLYSHARD_CHECK(marks != nullptr, "ManualWrap: no ShardedConstruction on this thread: build the engine inside the "
                                      "scope of a ShardedConstruction in which wrap(module) marked its units");
    POLYSHARD_CHECK(marks->size() > 0, "ManualWrap: no module was marked with wrap(module) in this thread's "
                                       "ShardedConstruction: mark the units (for example each Block) before building "
                                       "the engine, or use WrapWhole for one unit");
  }
  detail::UnitPlanner<T, D, Wrap, Checkpointing> planner(plan, threshold, marks);
  planner.walk(model, "", 0, true);
  if constexpr (Wrap::manual) {
    for (const auto& [key, order] : marks->marks())
      POLYSHARD_CHECK(planner.found().count(key) > 0, "ManualWrap: wrap() marked ", detail::describe_module(key),
                      " (mark ", order + 1, " of ", marks->size(), "), which is not a module of this model: mark "
                      "modules where they live in the model once it is built (a module moved after wrap() is "
                      "another object), and give each model its own ShardedConstruction");
  }
  for (auto& u : plan.units) u.padded = (u.numel + world_size - 1) / world_size * world_size;
  return plan;
}

}  // namespace polyshard
