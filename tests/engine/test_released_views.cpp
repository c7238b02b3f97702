// A tensor taken from a sharded parameter while its unit is gathered and read after the unit was
// freed: an error that says so, where it used to be a pointer computed from nothing.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"

using namespace polyshard;

TEST_CASE("a parameter's tensor read after a sharded strategy freed its unit is an error naming the cause",
          "[engine]") {
  using S = Strategy<ShardParameters<true>, WrapByType<Block>>;
  run_ranks(2, [](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    const Batch b = BatchSampler(test::tiny_data(), 8, 4, 7).batch(0, comm.rank(), comm.size());
    Tensor<float> embedding;  // the root unit's token embedding, taken while the root is gathered
    float first_inside = 0;
    Var<float> loss = engine.forward([&] {
      embedding = model.transformer.wte.weight.value();
      first_inside = embedding.data()[0];  // gathered: the whole weight, on every rank
      return model.loss(b.inputs, b.targets);
    });
    engine.backward(loss);  // the root's gradients are reduced and its gathered weights freed
    CHECK_THROWS_WITH(embedding.data(), Catch::Contains("Tensor of shape (13, 6)") && Catch::Contains("released"));
    CHECK_THROWS_WITH(model.transformer.wte.weight.value(), Catch::Contains("has no storage here"));

    // The same element read inside the next forward is the gathered weight again.
    engine.step(0.0);  // a zero learning rate: the weights keep their values
    engine.forward([&] {
      CHECK(embedding.data()[0] == first_inside);
      return model.loss(b.inputs, b.targets);
    });
  });
}
