// Handing work from one host thread to another when the work reads what a device stream of the
// first thread produces: the first marks the point its stream has reached, the second orders its
// own device work after that point, without either thread waiting for the device.
#pragma once

#include "polyshard/core/device.hpp"

namespace polyshard {

/// Specialized per device: DeviceHandoff<D>::mark() on the handing thread, and a
/// DeviceHandoff<D>::Enter, built from the mark, on the receiving thread for as long as its work
/// runs. (polyshard/core/cuda/device_handoff.hpp for Cuda.)
template <Device D>
struct DeviceHandoff;

/// Host work is ordered by the handing thread itself: nothing to carry.
template <>
struct DeviceHandoff<Cpu> {
  static DeviceHandoff mark() { return {}; }
  struct Enter {
    explicit Enter(const DeviceHandoff&) {}
  };
};

}  // namespace polyshard
