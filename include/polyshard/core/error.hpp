// The one error type polyshard throws, and the check macro that builds its messages.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace polyshard {

/// Every failure polyshard reports: bad input, mismatched shapes, a collective that timed out.
/// The message always names the operation and the values that were wrong.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <class... Parts>
[[noreturn]] void throw_error(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  throw Error(out.str());
}
}  // namespace detail

}  // namespace polyshard

/// Throws polyshard::Error with the streamed parts as its message when `cond` is false.
#define POLYSHARD_CHECK(cond, ...)                      \
  do {                                                  \
    if (!(cond)) ::polyshard::detail::throw_error(__VA_ARGS__); \
  } while (0)
