// OffloadPlacement<Offload>: where an offload policy keeps each unit's optimizer state between
// steps, as one specialization per kind of policy (engine/offload/*.hpp).
#pragma once

#include "polyshard/policy/offload.hpp"

namespace polyshard {

/// What the engine asks of a placement, as members of every specialization:
///   static constexpr const char* optimizer_state, parameters;  where they live between steps
///   place(optimizers, config, rank)  once the optimizers are built: take their state where it
///                                    lives between steps;
///   fetch(unit)      before the unit's optimizer step: its state resident (and the next unit's
///                    on its way);
///   store(unit)      after the step: its state on its way back;
///   settle()         after the last unit: every unit's state back where it lives between steps;
///   with_resident(unit, fn)  fn() with the unit's state resident, then put back (checkpoints).
template <class Offload>
struct OffloadPlacement {
  static_assert(sizeof(Offload) == 0,
                "no engine placement for this offload policy: specialize OffloadPlacement<P> in a header of its "
                "own (see engine/offload/*.hpp)");
};

}  // namespace polyshard
