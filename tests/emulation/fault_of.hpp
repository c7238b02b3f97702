// The emulated device's tests: the message of the DeviceFault a piece of device code raises.
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "polyshard/emulation/runtime.hpp"

namespace polyshard::emulation::test {

/// The fault's message, failing the test when `f` does not throw DeviceFault.
template <class F>
std::string fault_of(F&& f) {
  try {
    f();
  } catch (const DeviceFault& e) {
    return e.message;
  }
  FAIL("no DeviceFault");
  return {};
}

}  // namespace polyshard::emulation::test
