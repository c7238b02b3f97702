// NVMe offload is ZeRO-Infinity, which is stage 3: it needs ShardParameters.
// expect: offloading to NVMe needs ShardParameters
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardGradients, OffloadOptimizer<Nvme>>;
#else
using Composition = Strategy<ShardParameters<>, OffloadOptimizer<Nvme>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
