// Settings every communicator takes: the collective timeout and the call-checking debug mode.
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>

#include "polyshard/core/error.hpp"

namespace polyshard {

/// The timeout a communicator uses unless told otherwise: the environment variable
/// POLYSHARD_COMM_TIMEOUT (seconds, may be fractional: "0.5"), else 300 s.
/// Throws polyshard::Error when the variable is set but is not a positive number.
inline std::chrono::milliseconds default_comm_timeout() {
  const char* text = std::getenv("POLYSHARD_COMM_TIMEOUT");
  if (text == nullptr || *text == '\0') return std::chrono::minutes(5);
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  POLYSHARD_CHECK(end != text && *end == '\0' && seconds > 0,
                  "polyshard: POLYSHARD_COMM_TIMEOUT must be a positive number of seconds, got '", text, "'");
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}

/// Whether POLYSHARD_COMM_DEBUG is set to something other than "" or "0".
inline bool default_comm_debug() {
  const char* text = std::getenv("POLYSHARD_COMM_DEBUG");
  return text != nullptr && *text != '\0' && std::string(text) != "0";
}

/// Options of one communicator; split() passes them on to the sub-communicators.
struct CommOptions {
  /// A collective that has not completed after this long fails on every rank waiting in it.
  std::chrono::milliseconds timeout = default_comm_timeout();
  /// MPI backend: exchange a description of every call before it runs and report mismatched
  /// calls (costs one small all-gather per collective). The in-process backend always checks.
  /// Default: the environment variable POLYSHARD_COMM_DEBUG.
  bool check_calls = default_comm_debug();
};

}  // namespace polyshard
