// A type that is not a policy (here float, meant as 'fp32') is refused as a Strategy argument.
// expect: every argument must be a policy
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardGradients, float>;
#else
using Composition = Strategy<ShardGradients, Fp32>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
