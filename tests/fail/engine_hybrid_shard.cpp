// The policy layer accepts HybridShard, but the engine does not implement it yet and says so.
// expect: HybridShard is not supported by the engine yet
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/optim/adamw.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using S = Strategy<HybridShard<ShardGradients>>;
#else
using S = Strategy<ShardGradients>;
#endif

// Constructing the engine instantiates the class with its static_asserts.
void build(Gpt<float>& model, ThreadCommunicator& comm) {
  Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{});
}
