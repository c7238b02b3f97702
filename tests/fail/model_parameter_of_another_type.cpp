// Every parameter binds to a unit buffer of the model's one element type: a double parameter in
// a float model has no buffer to bind to.
// expect: every parameter of the model is of its element type on its device
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/linear.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"

using namespace polyshard;

struct Model {
#ifdef POLYSHARD_FAIL
  BOOST_HANA_DEFINE_STRUCT(Model, (Linear<float>, head), (Parameter<double>, scale));
#else
  BOOST_HANA_DEFINE_STRUCT(Model, (Linear<float>, head), (Parameter<float>, scale));
#endif
};

std::size_t engine_size() { return sizeof(Engine<ZeRO<3>, Model, ThreadCommunicator, AdamW<float>>); }
