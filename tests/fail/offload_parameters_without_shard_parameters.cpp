// Offloading parameters keeps parameter shards off the device between uses, so it needs ShardParameters.
// expect: offloading parameters needs ShardParameters
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardGradients, OffloadParameters<Cpu>>;
#else
using Composition = Strategy<ShardParameters<>, OffloadParameters<Cpu>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
