// Offloading the optimizer moves each rank's shard of it, so DDP (NoShard) cannot offload it.
// expect: offloading the optimizer needs a sharded optimizer
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<NoShard, OffloadOptimizer<Cpu>>;
#else
using Composition = Strategy<ShardOptimizerState, OffloadOptimizer<Cpu>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
