// Bytes sent and model-state bytes equal the compile-time formulas, and those equal ZeRO's; the
// bytes the backend measured moving equal its documented formula. The formulas are given the
// unit sizes worked out from the model's shapes (expected_layout.hpp), and the engine's layout
// must equal them.
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"
#include "expected_layout.hpp"
#include "io/temp_dir.hpp"

using namespace polyshard;
using test::train;

using Fsdp = Strategy<ShardParameters<true>, WrapByType<Block>>;
using GradOp = Strategy<ShardParameters<false>, WrapByType<Block>>;
using Accounted = std::tuple<DDP, ZeRO<1>, ZeRO<2>, ZeRO<3>, Fsdp, GradOp, Strategy<ShardGradients, Bf16Mixed>,
                             Strategy<ShardParameters<true>, Fp16Mixed, WrapByType<Block>>>;

TEMPLATE_LIST_TEST_CASE("bytes sent and model state equal the compile-time accounting", "[engine]", Accounted) {
  const int world = GENERATE(1, 2, 3, 4);
  CAPTURE(world);
  const auto r = train<TestType>(world, 2);
  const std::vector<std::int64_t> units = test::padded_units<TestType>(test::gpt_shapes(test::tiny_gpt()), world);
  const std::int64_t padded = test::sum(units);
  CHECK(r.padded == padded);
  CHECK(r.root_padded == units.front());
  const double expected_bytes = bytes_sent_per_step<TestType>(padded, units.front(), world);
  CHECK(r.bytes_sent == Approx(expected_bytes).epsilon(1e-12).margin(1e-9));
  // SGD with momentum keeps one state value per parameter.
  CHECK(double(r.model_state) == Approx(model_state_bytes<TestType>(padded, world, 1)).epsilon(1e-12));

  // The traffic the in-process backend measured, summed over the ranks, against the prediction
  // summed likewise (docs/communication.md): every collective moves what the ring formula says
  // (a reduction reads each chunk of the other ranks' inputs once, in the reduce type).
  const auto [moved_ag, sent_ag] = r.traffic.at(CollectiveKind::AllGather);
  const auto [moved_rs, sent_rs] = r.traffic.at(CollectiveKind::ReduceScatter);
  const auto [moved_ar, sent_ar] = r.traffic.at(CollectiveKind::AllReduce);
  CHECK(moved_ag == Approx(sent_ag).margin(1e-9));
  CHECK(moved_ar == Approx(sent_ar).margin(1e-9));
  CHECK(moved_rs == Approx(sent_rs).margin(1e-9));
  if (world > 1) CHECK(moved_ag + moved_rs + moved_ar > 0);  // the step did communicate
}

TEST_CASE("the accounting formulas are ZeRO's", "[engine]") {
  const std::int64_t p = 1'000'000 * 12;  // divisible by every N below
  for (int n : {1, 2, 3, 4}) {
    // Mixed-precision Adam: 2 + 2 + 12 bytes per parameter.
    using Mixed = Bf16Mixed;
    CHECK(model_state_bytes<Strategy<NoShard, Mixed>>(p, n) == Approx(16.0 * p));
    CHECK(model_state_bytes<Strategy<ShardOptimizerState, Mixed>>(p, n) == Approx((4.0 + 12.0 / n) * p));
    CHECK(model_state_bytes<Strategy<ShardGradients, Mixed>>(p, n) == Approx((2.0 + 14.0 / n) * p));
    CHECK(model_state_bytes<Strategy<ShardParameters<>, Mixed>>(p, n) == Approx(16.0 / n * p));
    // Communication in units of the parameter bytes (fp32): 2(N-1)/N for DDP, ZeRO-1 and ZeRO-2;
    // 3(N-1)/N for ZeRO-3 (with a root unit of no parameters).
    const double f = double(n - 1) / n, bytes = 4.0 * p;
    CHECK(bytes_sent_per_step<DDP>(p, 0, n) == Approx(2 * f * bytes));
    CHECK(bytes_sent_per_step<ZeRO<1>>(p, 0, n) == Approx(2 * f * bytes));
    CHECK(bytes_sent_per_step<ZeRO<2>>(p, 0, n) == Approx(2 * f * bytes));
    CHECK(bytes_sent_per_step<ZeRO<3>>(p, 0, n) == Approx(3 * f * bytes));
  }
}

#ifdef POLYSHARD_HAVE_LIBURING
TEST_CASE("ZeRO-Infinity: no optimizer state in memory between steps, in one the units' optimizer_buffer_count holds",
          "[engine][nvme]") {
  using S = with_t<ZeROInfinity, WrapByType<Block>>;  // 3 units: the root and 2 blocks
  const int world = GENERATE(1, 2, 4);
  const int buffers = GENERATE(1, 2, 4);  // Adam's units in memory at most: 4 buffers each
  CAPTURE(world, buffers);
  TempDir dir;
  StrategyConfig config;
  config.nvme_path = dir.path().string();
  config.block_size = 4096;
  config.queue_depth = 2;
  config.optimizer_buffer_count = buffers * nvme_buffers_per_sub_group(2);

  // Between steps: parameters and gradients only, as the formula says, and ZeRO-3's traffic.
  const auto r = test::train<S>(world, 2, 6, test::momentum_sgd(), std::numeric_limits<double>::infinity(), config);
  const std::vector<std::int64_t> units = test::padded_units<S>(test::gpt_shapes(test::tiny_gpt()), world);
  const std::int64_t padded = test::sum(units);
  REQUIRE(units.size() == 3);
  CHECK(r.padded == padded);
  CHECK(double(r.model_state) == Approx(model_state_bytes<S>(padded, world, 1)).epsilon(1e-12));
  CHECK(model_state_bytes<S>(padded, world, 1) == Approx(8.0 * double(padded) / world));
  CHECK(r.bytes_sent == Approx(bytes_sent_per_step<S>(padded, units.front(), world)).epsilon(1e-12));

  // During a step: each unit's Adam moments come back for its own step, never more than
  // `buffers` units' at once.
  struct Seen {
    std::int64_t peak = -1, after = -1, largest_unit = 0;
  };
  std::vector<Seen> seen(static_cast<std::size_t>(world));
  const AdamWConfig adamw{.lr = 1e-2};
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Seen& s = seen[static_cast<std::size_t>(comm.rank())];
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, adamw, config, 42);
    for (const auto& u : engine.units().units) s.largest_unit = std::max(s.largest_unit, u.padded);
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    for (int step = 0; step < 2; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      tracker.reset_peaks();
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, double(b.inputs.size(0)) / 6.0);
      loss = Var<float>();
      engine.step(adamw.lr);
    }
    s.peak = tracker.peak(MemoryCategory::OptimizerState);
    s.after = tracker.current(MemoryCategory::OptimizerState);
  });
  const std::int64_t largest_unit = *std::max_element(units.begin(), units.end());
  for (const Seen& s : seen) {
    CHECK(s.largest_unit == largest_unit);
    const double largest_state = offloaded_state_bytes_in_step<S>(largest_unit, world, nvme_buffers_per_sub_group(2));
    CHECK(s.after == 0);
    CHECK(double(s.peak) >= largest_state);  // the largest unit's moments, for its step
    CHECK(double(s.peak) <= offloaded_state_bytes_in_step<S>(largest_unit, world, config.optimizer_buffer_count));
    if (buffers == 1) CHECK(double(s.peak) == largest_state);
  }
}
#endif
