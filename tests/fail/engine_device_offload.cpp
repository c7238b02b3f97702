// Offload from a GPU (host or NVMe copies of its state) is not built: the engine says so instead of
// keeping the state on the device unannounced.
// expect: offloading from a device
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"

using namespace polyshard;
using S = Strategy<ShardGradients, OffloadOptimizer<Cpu>>;
#if defined(POLYSHARD_FAIL)
using Model = Gpt<float, Cuda>;
#else
using Model = Gpt<float>;  // the host model every strategy accepts
#endif

// Naming the engine type instantiates the class and its static_asserts.
std::size_t engine_size() { return sizeof(Engine<S, Model, ThreadCommunicator, AdamW<float>>); }
