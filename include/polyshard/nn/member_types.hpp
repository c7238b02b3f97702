// Compile-time walks over the types of a module tree (the members BOOST_HANA_DEFINE_STRUCT
// reflects, recursively), for checks that must hold before any module is built.
#pragma once

#include <boost/hana/accessors.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/unpack.hpp>
#include <type_traits>
#include <utility>

#include "polyshard/nn/reflect.hpp"

namespace polyshard {

namespace detail {
/// The type of the member of `Owner` that `Accessor` (an element of hana::accessors<Owner>())
/// reads.
template <class Owner, class Accessor>
using reflected_member_t =
    std::remove_cvref_t<decltype(boost::hana::second(std::declval<Accessor>())(std::declval<Owner&>()))>;
}  // namespace detail

template <class Owner, class Visit>
consteval int count_member_types(Visit visit);

/// Calls `visit.template operator()<X, Owner>()` for member type X of `Owner` (a std::vector is
/// looked through to its element type) and, where X is a module, for X's members in turn.
/// Returns how many of those calls returned true.
template <class X, class Owner, class Visit>
consteval int count_member_type(Visit visit) {
  if constexpr (detail::is_vector<X>::value) {
    return count_member_type<typename X::value_type, Owner>(visit);
  } else {
    const int here = visit.template operator()<X, Owner>() ? 1 : 0;
    if constexpr (Module<X> && !detail::is_parameter<X>::value) return here + count_member_types<X>(visit);
    else return here;
  }
}

/// The sum of count_member_type over every member `Owner` reflects: how many member
/// declarations in the tree under `Owner` (not counting `Owner` itself) `visit` accepts.
template <class Owner, class Visit>
consteval int count_member_types(Visit visit) {
  return boost::hana::unpack(boost::hana::accessors<Owner>(), [&](auto... accessors) {
    return (0 + ... + count_member_type<detail::reflected_member_t<Owner, decltype(accessors)>, Owner>(visit));
  });
}

}  // namespace polyshard
