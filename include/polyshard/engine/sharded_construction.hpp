// Manual wrapping (FairScale's enable_wrap / wrap): a scope on the building thread in which
// wrap(module) marks modules as units of their own, for an engine whose strategy uses ManualWrap.
#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeindex>
#include <utility>

#if defined(__GNUG__)
#include <cxxabi.h>

#include <cstdlib>
#endif

#include "polyshard/core/error.hpp"
#include "polyshard/nn/module_hooks.hpp"

namespace polyshard {

/// A module as the engine's call hooks see it: address and type (a struct and its first member
/// share an address).
using ModuleKey = std::pair<const void*, std::type_index>;

template <class M>
ModuleKey module_key(const M& m) {
  return {static_cast<const void*>(&m), std::type_index(typeid(M))};
}

namespace detail {
/// A type's name as written in C++ where the compiler can say it, for error messages; the
/// default device argument is left out ("polyshard::Block<float>", as the user wrote it).
inline std::string readable_type_name(std::type_index type) {
  std::string out = type.name();
#if defined(__GNUG__)
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  if (status == 0 && name) {
    out = name;
    std::free(name);
  }
#endif
  // Rebuilt by appending: GCC 12 warns falsely (-Wrestrict) about std::string::replace here.
  const std::string default_device = ", polyshard::Cpu>";
  std::string clean;
  std::size_t from = 0;
  for (std::size_t at; (at = out.find(default_device, from)) != std::string::npos; from = at + default_device.size())
    clean.append(out, from, at - from).push_back('>');
  clean.append(out, from, std::string::npos);
  return clean;
}

/// "polyshard::Block<float> at 0x7ffd...", for error messages.
inline std::string describe_module(const ModuleKey& key) {
  std::ostringstream out;
  out << readable_type_name(key.second) << " at " << key.first;
  return out.str();
}
}  // namespace detail

/// The units of a model built for a ManualWrap engine (FairScale's enable_wrap context).
/// Constructing one installs it on this thread until it is destroyed: in-process ranks, being
/// threads, each have their own. Inside it, wrap(module) marks a module as a unit of its own;
/// an Engine whose strategy uses ManualWrap, constructed while the context is installed, makes
/// every marked module a unit and leaves every other parameter in the root unit. Engines with
/// another wrap policy ignore the marks (as FairScale's wrap() is a no-op outside enable_wrap).
///
/// Marks are addresses: mark a module where it lives in the model, once the model is built (a
/// module moved after wrap() is no longer the module marked). One context holds the marks of
/// one model: every mark must lie in the model the ManualWrap engine is built on. Contexts nest
/// (the innermost is the current one), so two models can be built one inside the other's scope.
/// The context need only outlive the engine's constructor.
///
///     ShardedConstruction ctx;
///     Gpt<float> model(config);                        // allocates no parameter storage
///     for (auto& block : model.transformer.h) wrap(block);
///     Engine<Strategy<ShardParameters<true>, ManualWrap>, Gpt<float>, Comm, AdamW<float>> engine(model, comm, {});
class ShardedConstruction {
 public:
  ShardedConstruction() : saved_(slot()) { slot() = this; }
  ~ShardedConstruction() { slot() = saved_; }
  ShardedConstruction(const ShardedConstruction&) = delete;
  ShardedConstruction& operator=(const ShardedConstruction&) = delete;

  /// The innermost context on this thread, or null outside any.
  static ShardedConstruction* current() { return slot(); }

  /// Marks the module with key `key` as a unit of its own (wrap() calls this; a module marked
  /// twice is one mark).
  void mark(const ModuleKey& key) { marks_.emplace(key, marks_.size()); }

  bool marked(const ModuleKey& key) const { return marks_.count(key) > 0; }
  /// Number of modules marked.
  std::size_t size() const { return marks_.size(); }
  /// Every mark, with the order in which it was first made.
  const std::map<ModuleKey, std::size_t>& marks() const { return marks_; }

 private:
  static ShardedConstruction*& slot() {
    thread_local ShardedConstruction* current = nullptr;
    return current;
  }

  std::map<ModuleKey, std::size_t> marks_;
  ShardedConstruction* saved_;
};

/// Marks `module` as a unit of its own for the ManualWrap engine built in this thread's
/// ShardedConstruction context (FairScale's wrap()); returns `module`.
///   module  a module where it lives in the model (an lvalue: model.transformer.h[1]) that maps
///           an activation to an activation (ActivationModule: Block, Mlp, CausalSelfAttention,
///           LayerNorm, Linear), since the engine gathers and frees a unit around its call().
/// Throws polyshard::Error outside a ShardedConstruction context.
template <class M>
std::remove_reference_t<M>& wrap(M&& module) {
  using X = std::remove_cvref_t<M>;
  static_assert(std::is_lvalue_reference_v<M>,
                "wrap(module) requires 'module' to be a module where it lives in the model (an lvalue such as "
                "model.transformer.h[1]): units are found by address, and a temporary's address dies with it");
  static_assert(ActivationModule<X, float>,
                "wrap(module) requires 'module' to map an activation to an activation (m(x) returns Var<float>, as "
                "Block, Mlp and Linear do): the engine gathers and frees a unit around its call(), and cannot "
                "surround this module (an Embedding takes token ids: leave it in the root unit)");
  ShardedConstruction* context = ShardedConstruction::current();
  POLYSHARD_CHECK(context != nullptr, "wrap(", detail::readable_type_name(typeid(X)),
                  "): no ShardedConstruction on this thread: create one (ShardedConstruction ctx;) before marking "
                  "modules, and build the ManualWrap engine inside its scope");
  context->mark(module_key(static_cast<const X&>(module)));
  return module;
}

}  // namespace polyshard
