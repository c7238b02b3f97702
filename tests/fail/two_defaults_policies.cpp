// A strategy follows one reference's defaults; a second defaults policy is refused rather than
// one of them silently winning.
// expect: two defaults policies given
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardGradients, FairScaleShardedDefaults, DeepSpeedDefaults>;
#else
using Composition = Strategy<ShardGradients, FairScaleShardedDefaults>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
