// A strategy has one precision policy; a second one is refused rather than silently ignored.
// expect: two precision policies given
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<Bf16Mixed, ShardGradients, Fp32>;
#else
using Composition = Strategy<Bf16Mixed, ShardGradients>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
