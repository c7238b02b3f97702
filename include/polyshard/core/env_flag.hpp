// Switches read from the environment, for comparing a fused path with the unfused one in a
// single build (on a GPU, where each build costs device time).
#pragma once

#include <cstdlib>
#include <cstring>

namespace polyshard::detail {

/// False when the environment variable `name` is set to "0", true otherwise.
inline bool on_unless_zero(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace polyshard::detail
