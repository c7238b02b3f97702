// NVMe offload (ZeRO-Infinity) compiles where liburing is there, and where it is not it stops
// with a sentence saying so instead of keeping the optimizer state in memory unannounced.
// expect: OffloadOptimizer<Nvme> (ZeRO-Infinity) needs liburing
#if defined(POLYSHARD_FAIL)
#undef POLYSHARD_HAVE_LIBURING  // as a build that did not find liburing
#define POLYSHARD_TEST_STRATEGY ZeROInfinity
#elif __has_include(<liburing.h>)
#define POLYSHARD_HAVE_LIBURING 1  // as polyshard's CMake target defines it where it finds liburing
#define POLYSHARD_TEST_STRATEGY ZeROInfinity
#else
#define POLYSHARD_TEST_STRATEGY ZeRO<3>  // no liburing here: only the refusal can be checked
#endif

#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/presets.hpp"

using namespace polyshard;

// Constructing the engine instantiates the class with its placement and its static_asserts.
void build(Gpt<float>& model, ThreadCommunicator& comm) {
  Engine<POLYSHARD_TEST_STRATEGY, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{});
}
