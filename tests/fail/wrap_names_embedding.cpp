// A unit is gathered around a call that maps an activation to an activation; an Embedding takes
// token ids, so a policy that names it cannot make it a unit.
// expect: a module that the wrap or checkpointing policy names must map an activation to an activation
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using S = Strategy<ShardParameters<true>, WrapByType<Block, Embedding>>;
#else
using S = Strategy<ShardParameters<true>, WrapByType<Block>>;
#endif

std::size_t engine_size() { return sizeof(Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>>); }
