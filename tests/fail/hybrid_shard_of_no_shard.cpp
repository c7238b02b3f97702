// HybridShard<NoShard> shards nothing within a group: it is DDP under another name.
// expect: HybridShard<NoShard> shards nothing within a group: use NoShard (DDP) instead
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<HybridShard<NoShard>>;
#else
using Composition = Strategy<HybridShard<ShardGradients>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
