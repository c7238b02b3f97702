// One composition of the policy lattice (tests/support/policy_lattice.hpp), number
// POLYSHARD_LATTICE_INDEX, instantiated as Engine instantiates it before it meets a model: the
// Strategy and its offload placement. check_lattice.cmake compiles it for the predicate's samples.
#include "polyshard/engine/offload.hpp"
#include "support/policy_lattice.hpp"

#ifndef POLYSHARD_LATTICE_INDEX
#error "compile with -DPOLYSHARD_LATTICE_INDEX=<the composition's number>"
#endif

using Composition = polyshard::test::lattice::strategy_t<POLYSHARD_LATTICE_INDEX>;

// sizeof needs the complete types, which instantiates them and their static_asserts.
static_assert(sizeof(Composition) > 0);
static_assert(sizeof(polyshard::OffloadPlacement<typename Composition::offload>) > 0);
