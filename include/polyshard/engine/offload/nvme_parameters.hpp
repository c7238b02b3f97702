// OffloadParameters<Nvme> (DeepSpeed's offload_param device nvme): parameter shards on NVMe are
// not built; the engine refuses the policy rather than keep the shards in memory unannounced.
#pragma once

#include "polyshard/engine/offload/placement.hpp"

namespace polyshard {

template <class Offload>
  requires(Offload::to_nvme && Offload::offloads_parameters)
struct OffloadPlacement<Offload> {
  static_assert(sizeof(Offload) == 0,
                "OffloadParameters<Nvme>: parameter shards on NVMe are not supported by the engine yet; "
                "OffloadOptimizer<Nvme> (ZeRO-Infinity's optimizer state on NVMe) is");
};

}  // namespace polyshard
