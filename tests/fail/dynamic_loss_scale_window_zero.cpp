// loss_scale_window counts the overflow-free steps before the scale doubles: a window of 0 is refused.
// expect: loss_scale_window must be at least 1
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardGradients, MixedPrecision<half, float, float, DynamicLossScale<16, 0>>>;
#else
using Composition = Strategy<ShardGradients, MixedPrecision<half, float, float, DynamicLossScale<16, 500>>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
