// A strategy has one sharding policy; a second one is refused rather than silently ignored.
// expect: two sharding policies given
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardGradients, OffloadOptimizer<Cpu>, NoShard>;
#else
using Composition = Strategy<ShardGradients, OffloadOptimizer<Cpu>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
