// NoOffload and offloading to the CPU (ZeRO-Offload, FSDP cpu_offload): where the offloaded
// state lives is the unit state's business (UnitState::step_device and shard_device put master
// weights, optimizer state and parameter shards in host memory when the model computes on a
// device; a host model has them there already), and the optimizer steps them there. Between
// steps nothing moves, so this placement does nothing.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "polyshard/engine/offload/placement.hpp"
#include "polyshard/policy/config.hpp"

namespace polyshard {

template <class Offload>
  requires(!Offload::to_nvme)
struct OffloadPlacement<Offload> : ParametersInMemory {
  static constexpr const char* optimizer_state = "host";
  static constexpr const char* parameters = "host";

  template <class State, class Opt>
  void place(std::size_t, std::vector<State>&, std::vector<Opt>&, const StrategyConfig&, int) {}
  void finish_placing() {}
  void fetch(std::size_t) {}
  void fetch_group(std::size_t, std::size_t) {}
  void store_group(std::size_t, std::size_t) {}
  void store(std::size_t) {}
  void settle() {}
  template <class F>
  decltype(auto) with_resident(std::size_t, F&& fn) {
    return std::forward<F>(fn)();
  }
};

}  // namespace polyshard
