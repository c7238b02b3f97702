// OffloadPlacement<Offload>: where an offload policy keeps each unit's optimizer state (and,
// offloading parameters to NVMe, its parameter shard) between uses, as one specialization per
// kind of policy (engine/offload/*.hpp).
#pragma once

#include "polyshard/policy/offload.hpp"

namespace polyshard {

/// What the engine asks of a placement, as members of every specialization:
///   static constexpr const char* optimizer_state, parameters;  where they live between steps
///   place(units, optimizers, config, rank)  once the units and optimizers are built: take
///                    their state where it lives between steps;
///   fetch(unit)      before the unit's optimizer step: its state (and parameter shard)
///                    resident, and the next unit's on its way;
///   store(unit)      after the step and the write-back of its parameters: its state on its way back;
///   settle()         after the last unit: every unit's state back where it lives between steps;
///   with_resident(unit, fn)  fn() with the unit's state and parameter shard resident, then put
///                    back (checkpoints);
///   acquire_parameters(unit), release_parameters(unit)  around a read of the unit's parameter
///                    shard outside the step (a gather): resident from the first to the second;
///   may_read_parameters_ahead(unit)  whether a gather issued ahead of its unit (a prefetch) may
///                    bring the unit's shard in now;
///   with_parameters(unit, fn)  fn() with the unit's parameter shard resident, for reading.
template <class Offload>
struct OffloadPlacement {
  static_assert(sizeof(Offload) == 0,
                "no engine placement for this offload policy: specialize OffloadPlacement<P> in a header of its "
                "own (see engine/offload/*.hpp)");
};

}  // namespace polyshard
