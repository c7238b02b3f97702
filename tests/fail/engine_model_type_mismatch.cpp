// A device model must compute in the precision policy's compute type: an fp32 model under a bf16
// policy would bind float parameters to bf16 buffers.
// expect: the model's element type does not fit the strategy
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"

using namespace polyshard;
using S = Strategy<ShardParameters<true>, Bf16Mixed>;
#if defined(POLYSHARD_FAIL)
using Model = Gpt<float, Cuda>;
#else
using Model = Gpt<float>;  // the host model every strategy accepts
#endif

// Naming the engine type instantiates the class and its static_asserts.
std::size_t engine_size() { return sizeof(Engine<S, Model, ThreadCommunicator, AdamW<float>>); }
