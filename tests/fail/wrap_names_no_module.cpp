// A wrap policy whose name matches no module of the model would leave the whole model one unit,
// silently: under ZeRO-3 every rank would gather all of it at once.
// expect: the wrap or checkpointing policy names a module type that the model does not contain
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"

using namespace polyshard;

/// A plain struct of the model's own.
struct Head {
  BOOST_HANA_DEFINE_STRUCT(Head, (Linear<float>, proj));
  Var<float> operator()(const Var<float>& x) const { return call(proj, x); }
};
struct Model {
  BOOST_HANA_DEFINE_STRUCT(Model, (Embedding<float>, embed), (std::vector<Head>, heads));
};

#ifdef POLYSHARD_FAIL
using S = Strategy<ShardParameters<true>, WrapByType<Block>>;  // Model has no Block
#else
using S = Strategy<ShardParameters<true>, WrapByClass<Head>>;
#endif

std::size_t engine_size() { return sizeof(Engine<S, Model, ThreadCommunicator, AdamW<float>>); }
