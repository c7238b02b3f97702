// Test cases that need several CUDA devices: where fewer are visible, such a case does not run
// and says so, and the program's main (gpu_main.cpp) then exits with CTest's skip code once every
// case that ran has passed, so that a run on one GPU shows as skipped, never as passed. On the
// emulated device, which has four, a case that finds too few fails the program instead.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>

#include "polyshard/core/cuda/runtime.hpp"

namespace polyshard::test {

/// Cases of this program that found fewer devices than they need.
inline std::atomic<int> cases_short_of_devices{0};

/// Whether `needed` CUDA devices are visible; where not, the case is counted as not run and a
/// warning names what it needed, and the caller returns without its checks.
inline bool have_devices(int needed) {
  const int visible = cuda::available_devices().count;
  if (visible >= needed) return true;
  ++cases_short_of_devices;
  WARN("this case needs " << needed << " CUDA devices and " << visible << " are visible: it did not run");
  return false;
}

}  // namespace polyshard::test
