// What an OffloadPolicy changes in this engine. The engine computes on the CPU: every buffer is
// already host memory and the optimizer already runs on the CPU, so offloading to the CPU
// (ZeRO-Offload, FSDP cpu_offload) places nothing differently here; it becomes a transfer
// schedule once a device other than the CPU computes. NVMe offload moves optimizer state to
// files and is not implemented yet.
#pragma once

#include "polyshard/policy/offload.hpp"

namespace polyshard {

template <class Offload>
struct OffloadPlacement {
  static_assert(!Offload::to_nvme, "NVMe offload is not supported by the engine yet");
  /// Where master weights and optimizer state live between steps.
  static constexpr const char* optimizer_state = "host";
  /// Where parameter shards live between uses.
  static constexpr const char* parameters = "host";
};

}  // namespace polyshard
