// Only a module the engine can surround (one that maps an activation to an activation) can be
// wrapped; an Embedding takes token ids.
// expect: wrap(module) requires 'module' to map an activation to an activation
#include "polyshard/engine/sharded_construction.hpp"
#include "polyshard/nn/gpt.hpp"

using namespace polyshard;

void mark(Gpt<float>& model) {
#ifdef POLYSHARD_FAIL
  wrap(model.transformer.wte);
#else
  wrap(model.transformer.h[0]);
#endif
}
