// Master weights narrower than the compute dtype would lose every update.
// expect: master weights narrower than the compute dtype would lose every update
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardGradients, MixedPrecision<float, float, bfloat16>>;
#else
using Composition = Strategy<ShardGradients, MixedPrecision<bfloat16, float, float>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
