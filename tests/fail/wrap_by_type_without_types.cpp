// WrapByType<> names no module type, so it would wrap nothing: it is refused.
// expect: WrapByType<Ms...>: name at least one module type to wrap
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

// A module template standing in for a transformer block (policy headers only, no nn layer).
template <class T>
struct MyBlock {};

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardParameters<>, WrapByType<>>;
#else
using Composition = Strategy<ShardParameters<>, WrapByType<MyBlock>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
