// HybridShard of a HybridShard nests hybrid sharding, which means nothing.
// expect: nests hybrid sharding, which means nothing
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<HybridShard<HybridShard<ShardParameters<>>>>;
#else
using Composition = Strategy<HybridShard<ShardParameters<>>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
