// Units are found by address: a temporary module cannot be wrapped.
// expect: wrap(module) requires 'module' to be a module where it lives in the model
#include "polyshard/engine/sharded_construction.hpp"
#include "polyshard/nn/block.hpp"

using namespace polyshard;

void mark(Block<float>& block) {
#ifdef POLYSHARD_FAIL
  wrap(Block<float>(6, 2, 0.02));
#else
  wrap(block);
#endif
}
