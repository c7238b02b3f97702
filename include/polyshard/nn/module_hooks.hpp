// The seam between modules and a training engine: a module calls its children through call(),
// and an engine installed on the thread decides what happens around each call (gather a
// sharded unit before it, free it after, checkpoint its activations). With no engine, call()
// is a plain call.
#pragma once

#include <concepts>
#include <functional>
#include <typeindex>

#include "polyshard/autograd/variable.hpp"

namespace polyshard {

/// What an engine does around module calls on this thread, for modules computing in T on D.
template <FloatElement T, Device D = Cpu>
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  /// Runs `body(x)`, which computes `module` (of type `type`) on `x`, with the engine's work
  /// around it. A module is identified by address and type together: a struct and its first
  /// member share an address.
  virtual Var<T, D> around(const void* module, std::type_index type,
                           const std::function<Var<T, D>(const Var<T, D>&)>& body, const Var<T, D>& x) = 0;
  /// Whether around() is a plain call for `module`: the engine gathers, frees and checkpoints
  /// nothing for it. A module may then compute several children in one op (Mlp on a GPU)
  /// without losing the engine's work around each. Unknown, by default.
  virtual bool leaves_plain(const void* module, std::type_index type) const { return false; }
};

namespace detail {
template <FloatElement T, Device D>
ModuleHooks<T, D>*& thread_module_hooks() {
  thread_local ModuleHooks<T, D>* hooks = nullptr;
  return hooks;
}
}  // namespace detail

/// Installs `hooks` for this thread until the scope ends.
template <FloatElement T, Device D = Cpu>
class ModuleHooksScope {
 public:
  explicit ModuleHooksScope(ModuleHooks<T, D>& hooks) : saved_(detail::thread_module_hooks<T, D>()) {
    detail::thread_module_hooks<T, D>() = &hooks;
  }
  ~ModuleHooksScope() { detail::thread_module_hooks<T, D>() = saved_; }
  ModuleHooksScope(const ModuleHooksScope&) = delete;
  ModuleHooksScope& operator=(const ModuleHooksScope&) = delete;

 private:
  ModuleHooks<T, D>* saved_;
};

/// A module that maps one activation to another, and so can be a unit of a sharded strategy.
template <class M, class T, class D = Cpu>
concept ActivationModule = requires(const M& m, const Var<T, D>& x) {
  { m(x) } -> std::same_as<Var<T, D>>;
};

/// Calls `module(x)`, through the engine's hooks when one is installed on this thread for
/// modules of T on D.
template <class M, FloatElement T, Device D>
  requires ActivationModule<M, T, D>
Var<T, D> call(const M& module, const Var<T, D>& x) {
  if (ModuleHooks<T, D>* hooks = detail::thread_module_hooks<T, D>())
    return hooks->around(&module, std::type_index(typeid(M)), [&module](const Var<T, D>& in) { return module(in); }, x);
  return module(x);
}

/// Whether call() of each of `modules` is a plain call on this thread: no hooks installed for T
/// on D, or hooks that leave each of them plain.
template <FloatElement T, Device D, class... M>
bool calls_are_plain(const M&... modules) {
  const ModuleHooks<T, D>* hooks = detail::thread_module_hooks<T, D>();
  return hooks == nullptr || (hooks->leaves_plain(&modules, std::type_index(typeid(M))) && ...);
}

/// Calls `body(x)` in place of `module(x)`, with the engine's work around it as call() has it:
/// for another forward of the module (one that also reads and extends a key-value cache) that
/// needs the module's unit gathered as its forward does.
template <class M, FloatElement T, Device D, class Body>
  requires std::same_as<std::invoke_result_t<Body&, const Var<T, D>&>, Var<T, D>>
Var<T, D> call_as(const M& module, const Var<T, D>& x, Body&& body) {
  if (ModuleHooks<T, D>* hooks = detail::thread_module_hooks<T, D>())
    return hooks->around(&module, std::type_index(typeid(M)), [&body](const Var<T, D>& in) { return body(in); }, x);
  return body(x);
}

}  // namespace polyshard
