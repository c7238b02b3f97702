// The engine walks the model's members for names, units and initialisation: a struct whose
// members are not reflected has nothing it can walk.
// expect: the engine's model is a module, a struct whose members BOOST_HANA_DEFINE_STRUCT declares
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/linear.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
struct Model {
  Linear<float> head;
};
#else
struct Model {
  BOOST_HANA_DEFINE_STRUCT(Model, (Linear<float>, head));
};
#endif

// Naming the engine type instantiates the class and its static_asserts.
std::size_t engine_size() { return sizeof(Engine<ZeRO<3>, Model, ThreadCommunicator, AdamW<float>>); }
