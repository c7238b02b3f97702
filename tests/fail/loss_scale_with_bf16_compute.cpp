// Loss scaling exists for fp16 gradients; bf16 has fp32's exponent range, so a static scale with bf16 compute is refused.
// expect: loss scaling protects fp16 gradients from underflow
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardGradients, MixedPrecision<bfloat16, float, float, StaticLossScale<8>>>;
#else
using Composition = Strategy<ShardGradients, MixedPrecision<half, float, float, StaticLossScale<8>>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
