// Compile-time traversal of a module tree: modules are structs whose members Boost.Hana
// reflects, so every parameter and buffer is visited with the name PyTorch would give it.
#pragma once

#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "polyshard/nn/buffer.hpp"
#include "polyshard/nn/parameter.hpp"

namespace polyshard {

namespace detail {
template <class X>
struct is_parameter : std::false_type {};
template <class T, class D>
struct is_parameter<Parameter<T, D>> : std::true_type {};
template <class X>
struct is_vector : std::false_type {};
template <class X, class A>
struct is_vector<std::vector<X, A>> : std::true_type {};

inline std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
}  // namespace detail

/// A module: a struct reflected with BOOST_HANA_DEFINE_STRUCT whose members are parameters,
/// buffers, modules, or std::vectors of modules (named by index, as nn.ModuleList names them).
template <class M>
concept Module = boost::hana::Struct<M>::value;

/// Calls `f(name, parameter)` for every parameter of `m`, in declaration order, with dotted
/// PyTorch names ("transformer.h.0.attn.c_attn.weight"). Works on const and mutable modules.
template <class M, class F>
void visit_parameters(M& m, F&& f, const std::string& prefix = "") {
  using X = std::remove_const_t<M>;
  if constexpr (detail::is_parameter<X>::value) {
    f(prefix, m);
  } else if constexpr (detail::is_buffer<X>::value) {
    return;
  } else if constexpr (detail::is_vector<X>::value) {
    for (std::size_t i = 0; i < m.size(); ++i) visit_parameters(m[i], f, detail::join_name(prefix, std::to_string(i)));
  } else {
    static_assert(Module<X>, "visit_parameters(m, f) requires 'm' to be a module: a struct declared with "
                             "BOOST_HANA_DEFINE_STRUCT whose members are parameters, buffers, modules or vectors of "
                             "modules");
    boost::hana::for_each(boost::hana::accessors<X>(), [&](auto accessor) {
      const std::string name = boost::hana::to<const char*>(boost::hana::first(accessor));
      visit_parameters(boost::hana::second(accessor)(m), f, detail::join_name(prefix, name));
    });
  }
}

/// Calls `f(name, buffer)` for every Buffer of `m`, in declaration order, with PyTorch's names
/// ("norm.running_mean"). Works on const and mutable modules.
template <class M, class F>
void visit_buffers(M& m, F&& f, const std::string& prefix = "") {
  using X = std::remove_const_t<M>;
  if constexpr (detail::is_buffer<X>::value) {
    f(prefix, m);
  } else if constexpr (detail::is_parameter<X>::value) {
    return;
  } else if constexpr (detail::is_vector<X>::value) {
    for (std::size_t i = 0; i < m.size(); ++i) visit_buffers(m[i], f, detail::join_name(prefix, std::to_string(i)));
  } else {
    static_assert(Module<X>, "visit_buffers(m, f) requires 'm' to be a module: a struct declared with "
                             "BOOST_HANA_DEFINE_STRUCT whose members are parameters, buffers, modules or vectors of "
                             "modules");
    boost::hana::for_each(boost::hana::accessors<X>(), [&](auto accessor) {
      const std::string name = boost::hana::to<const char*>(boost::hana::first(accessor));
      visit_buffers(boost::hana::second(accessor)(m), f, detail::join_name(prefix, name));
    });
  }
}

/// Number of scalar parameters of a module (a tied weight counts once: it is one member).
template <class M>
std::int64_t count_parameters(const M& m) {
  std::int64_t n = 0;
  visit_parameters(m, [&](const std::string&, const auto& p) { n += p.numel(); });
  return n;
}

}  // namespace polyshard
