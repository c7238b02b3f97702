// Settings every communicator takes: the collective timeout and the cross-rank check of calls.
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

/// Whether calls are compared across ranks: yes, unless the environment variable
/// POLYSHARD_COMM_CHECK_CALLS is "0".
inline bool default_check_calls() {
  const char* text = std::getenv("POLYSHARD_COMM_CHECK_CALLS");
  return text == nullptr || std::string(text) != "0";
}

/// Options of one communicator; split() passes them on to the sub-communicators.
struct CommOptions {
  /// A collective that has not completed after this long fails on every rank waiting in it.
  std::chrono::milliseconds timeout = default_comm_timeout();
  /// MPI and NCCL backends: exchange a description of every call (and its CallSite) before it
  /// runs and report mismatched calls on every rank, at the cost of a 56-byte message to every
  /// other rank per collective under MPI, and under NCCL of a 312-byte all-gather enqueued ahead
  /// of each collective (docs/communication.md gives the measured cost). The in-process backend
  /// always checks.
  /// Default: on, unless the environment variable POLYSHARD_COMM_CHECK_CALLS is "0".
  bool check_calls = default_check_calls();
};

}  // namespace polyshard
