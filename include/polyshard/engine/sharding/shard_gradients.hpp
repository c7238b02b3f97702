// ShardGradients (ZeRO-2, FairScale OSS + ShardedDataParallel): whole parameters; a unit's
// local gradients exist only during its backward and are reduce-scattered into the shard the
// rank owns, which is all of the gradient it keeps.
#pragma once

#include "polyshard/engine/sharding/behaviour.hpp"

namespace polyshard {

template <>
struct ShardingBehaviour<ShardGradients> : detail::WholeParameters, detail::ShardedGradients {
  template <class U>
  static void allocate(U& u, std::uint64_t seed) {
    allocate_with_master_shard(u, seed);
    allocate_grads(u);
  }

  template <class U>
  static auto optimizer_params(U& u) { return u.master; }

  template <class U, class Comm>
  static void after_step(U& u, Comm& comm) { write_back_and_gather(u, comm); }
};

}  // namespace polyshard
