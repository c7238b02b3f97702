// Parameters of a sharded unit read while the unit is released: an error naming the parameter
// and its unit, never a pointer computed from nothing. A tensor taken inside forward and read
// after the unit was freed, a parameter read after a step, and the root unit after a forward
// without gradients (evaluation), at world sizes 1 and 2. Rank bodies only record what they
// saw; the test thread checks it.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"
#include "support/error_of.hpp"

using namespace polyshard;
using test::error_of;

namespace {

/// What one rank saw reading released parameters (each an error message, "" for none).
struct ReleasedReads {
  std::string root_view_after_backward;    // the token embedding's tensor, taken inside forward
  std::string block_parameter_after_forward;  // a block's weight between forward and backward
  std::string root_parameter_after_step;   // model.transformer.wte.weight.value()
  std::string block_parameter_after_step;
  std::string root_view_after_eval;        // the embedding taken inside a forward without gradients
  std::string root_parameter_after_eval;
  bool same_value_when_gathered_again = false;
};

using ZeRO3 = Strategy<ShardParameters<true>, WrapByType<Block>>;

std::vector<ReleasedReads> read_released(int world) {
  std::vector<ReleasedReads> seen(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    ReleasedReads& r = seen[static_cast<std::size_t>(comm.rank())];
    Gpt<float> model(test::tiny_gpt());
    Engine<ZeRO3, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    const Batch b = BatchSampler(test::tiny_data(), 8, 4, 7).batch(0, comm.rank(), comm.size());
    const auto& embedding_weight = model.transformer.wte.weight;
    const auto& block_weight = model.transformer.h[0].attn.c_attn.weight;

    Tensor<float> embedding;
    float first_inside = 0;
    Var<float> loss = engine.forward([&] {
      embedding = embedding_weight.value();
      first_inside = embedding.data()[0];  // gathered: the whole weight, on every rank
      return model.loss(b.inputs, b.targets);
    });
    r.block_parameter_after_forward = error_of([&] { (void)block_weight.value(); });  // resharded after its forward
    engine.backward(loss);  // the root's gradients are reduced and its gathered weights freed
    r.root_view_after_backward = error_of([&] { (void)embedding.data(); });
    engine.step(0.0);  // a zero learning rate: the weights keep their values
    r.root_parameter_after_step = error_of([&] { (void)embedding_weight.value(); });
    r.block_parameter_after_step = error_of([&] { (void)block_weight.value(); });

    // The same element read inside the next forward is the gathered weight again.
    loss = engine.forward([&] {
      r.same_value_when_gathered_again = embedding.data()[0] == first_inside;
      return model.loss(b.inputs, b.targets);
    });
    engine.backward(loss);

    // Evaluation: no backward follows, so the root is freed when the forward returns.
    Tensor<float> evaluated;
    {
      NoGradGuard no_grad;
      engine.forward([&] {
        evaluated = embedding_weight.value();
        return model.loss(b.inputs, b.targets);
      });
    }
    r.root_view_after_eval = error_of([&] { (void)evaluated.data(); });
    r.root_parameter_after_eval = error_of([&] { (void)embedding_weight.value(); });
  });
  return seen;
}

}  // namespace

TEST_CASE("parameters read while their sharded unit is released are errors naming the parameter and the unit",
          "[engine]") {
  using Catch::Contains;
  for (const int world : {1, 2}) {
    const auto seen = read_released(world);
    for (int rank = 0; rank < world; ++rank) {
      INFO("world size " << world << ", rank " << rank);
      const ReleasedReads& r = seen[static_cast<std::size_t>(rank)];
      const auto root_view = Contains("Tensor of shape (13, 6) views parameter 'transformer.wte.weight' of the root "
                                      "unit, which is not gathered now: its elements were released");
      CHECK_THAT(r.root_view_after_backward, root_view);
      CHECK_THAT(r.root_view_after_eval, root_view);
      const auto block_parameter = Contains("parameter 'transformer.h.0.attn.c_attn.weight' of shape (18, 6) has no "
                                            "storage here: it is parameter 'transformer.h.0.attn.c_attn.weight' of "
                                            "unit 'transformer.h.0', which is not gathered now");
      CHECK_THAT(r.block_parameter_after_forward, block_parameter);
      CHECK_THAT(r.block_parameter_after_step, block_parameter);
      const auto root_parameter = Contains("parameter 'transformer.wte.weight' of shape (13, 6) has no storage here: "
                                           "it is parameter 'transformer.wte.weight' of the root unit, which is not "
                                           "gathered now");
      CHECK_THAT(r.root_parameter_after_step, root_parameter);
      CHECK_THAT(r.root_parameter_after_eval, root_parameter);
      CHECK(r.same_value_when_gathered_again);
    }
  }
}
