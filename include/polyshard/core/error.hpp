// The one error type polyshard throws, and the check macro that builds its messages.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace polyshard {

/// Every failure polyshard reports: bad input, mismatched shapes, a collective that timed out.
/// The message always names the operation and the values that were wrong.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
/// Streams one part of a message: one out-of-line instance per part type, shared by every
/// message, so that a check costs its caller a call per part rather than an inlined stream
/// expression per distinct message (a large share of the code of every translation unit).
template <class Part>
[[gnu::cold, gnu::noinline]] void append_part(std::ostringstream& out, const Part& part) {
  out << part;
}

/// The message's parts with arrays decayed (every string literal a const char*), so that
/// messages of the same part types share one instance.
template <class... Parts>
[[noreturn, gnu::cold, gnu::noinline]] void throw_parts(const Parts&... parts) {
  std::ostringstream out;
  (append_part<Parts>(out, parts), ...);
  throw Error(out.str());
}

template <class... Parts>
[[noreturn]] inline void throw_error(const Parts&... parts) {
  throw_parts<std::decay_t<const Parts>...>(parts...);
}
}  // namespace detail

}  // namespace polyshard

/// Throws polyshard::Error with the streamed parts as its message when `cond` is false.
#define POLYSHARD_CHECK(cond, ...)                      \
  do {                                                  \
    if (!(cond)) ::polyshard::detail::throw_error(__VA_ARGS__); \
  } while (0)
