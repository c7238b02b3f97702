// NoOffload and offloading to the CPU (ZeRO-Offload, FSDP cpu_offload): the engine computes on
// the CPU, so every buffer is host memory already and the optimizer already steps there. The
// placement does nothing; it becomes a transfer schedule once a device other than the CPU
// computes.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "polyshard/engine/offload/placement.hpp"
#include "polyshard/policy/config.hpp"

namespace polyshard {

template <class Offload>
  requires(!Offload::to_nvme)
struct OffloadPlacement<Offload> {
  static constexpr const char* optimizer_state = "host";
  static constexpr const char* parameters = "host";

  template <class Opt>
  void place(std::vector<Opt>&, const StrategyConfig&, int) {}
  void fetch(std::size_t) {}
  void store(std::size_t) {}
  void settle() {}
  template <class F>
  decltype(auto) with_resident(std::size_t, F&& fn) {
    return std::forward<F>(fn)();
  }
};

}  // namespace polyshard
