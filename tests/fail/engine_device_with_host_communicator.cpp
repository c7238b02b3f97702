// A model on a GPU with a communicator of host memory (threads, MPI): the collectives would read device
// pointers on the host.
// expect: needs a communicator of device buffers
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"

using namespace polyshard;
using S = Strategy<NoShard>;
#if defined(POLYSHARD_FAIL)
using Model = Gpt<float, Cuda>;
#else
using Model = Gpt<float>;  // the host model every strategy accepts
#endif

// Naming the engine type instantiates the class and its static_asserts.
std::size_t engine_size() { return sizeof(Engine<S, Model, ThreadCommunicator, AdamW<float>>); }
