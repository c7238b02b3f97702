// The message of the polyshard::Error a callable throws: for tests of error cases that run
// where Catch2's assertions may not (rank threads) or that compare messages across ranks.
#pragma once

#include <string>

#include "polyshard/core/error.hpp"

namespace polyshard::test {

/// The message of the polyshard::Error that `f` throws, or "" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace polyshard::test
