// Loss scaling exists for fp16 gradients; with fp32 compute it is refused.
// expect: loss scaling protects fp16 gradients from underflow
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardGradients, MixedPrecision<float, float, float, DynamicLossScale<>>>;
#else
using Composition = Strategy<ShardGradients, MixedPrecision<half, half, float, DynamicLossScale<>>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
