// A strategy has one offload policy; a second one is refused rather than silently ignored.
// expect: two offload policies given
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardParameters<>, OffloadParameters<Cpu>, NoOffload>;
#else
using Composition = Strategy<ShardParameters<>, OffloadParameters<Cpu>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
