// A reflected member that is neither a parameter nor a module (here a flag) has no parameters
// to walk: it belongs outside BOOST_HANA_DEFINE_STRUCT.
// expect: every member BOOST_HANA_DEFINE_STRUCT declares is a Parameter, a Buffer, a module or a std::vector of modules
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/linear.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"

using namespace polyshard;

struct Model {
#ifdef POLYSHARD_FAIL
  BOOST_HANA_DEFINE_STRUCT(Model, (Linear<float>, head), (bool, tied));
#else
  BOOST_HANA_DEFINE_STRUCT(Model, (Linear<float>, head));
  bool tied = false;
#endif
};

std::size_t engine_size() { return sizeof(Engine<ZeRO<3>, Model, ThreadCommunicator, AdamW<float>>); }
