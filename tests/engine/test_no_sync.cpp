// Gradient accumulation: micro-batches under no_sync, then one synchronising backward, equal
// one large batch; so do the micro-batches the engine counts (gradient_accumulation_steps).
#include <catch2/catch.hpp>

#include "divergence.hpp"
#include "engine_fixture.hpp"
#include "support/error_of.hpp"

using namespace polyshard;

namespace {
/// How the micro-batches of a step are reduced.
enum class Reduction {
  last_backward,   // every backward but the last under no_sync
  every_backward,  // no no_sync: each backward reduces
  manual,          // every backward under no_sync, then Engine::reduce()
  manual_twice,    // as manual, and reduce() once more with nothing pending
  engine_counts,   // gradient_accumulation_steps = micro: backward() and step() for each
};

/// Two steps on global batches of 6 rows, each as `micro` micro-batches of 6 / micro rows,
/// reduced as `how` says.
template <class S>
test::Parameters accumulate(int world, int micro, Reduction how = Reduction::last_backward) {
  test::Parameters out;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    StrategyConfig config;
    if (how == Reduction::engine_counts) config.gradient_accumulation_steps = micro;
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), config, 42);
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    const std::int64_t rows_per_micro = 6 / micro;
    for (int step = 0; step < 2; ++step) {
      const Batch whole = sampler.batch(step);
      for (int m = 0; m < micro; ++m) {
        const RowRange rows = rank_rows(rows_per_micro, comm.rank(), world);
        const std::int64_t begin = m * rows_per_micro + rows.begin, end = m * rows_per_micro + rows.end;
        const auto x = whole.inputs.slice(begin, end), y = whole.targets.slice(begin, end);
        std::optional<typename decltype(engine)::NoSync> no_sync;
        const bool last = m + 1 == micro;
        if ((how == Reduction::last_backward && !last) || how == Reduction::manual ||
            how == Reduction::manual_twice)
          no_sync.emplace(engine);
        Var<float> loss = engine.forward([&] { return model.loss(x, y); });
        if (how == Reduction::engine_counts) {
          // The share of the micro-batch, which the engine divides by the accumulation steps.
          engine.backward(loss, double(end - begin) / double(rows_per_micro));
          if (engine.step(0.1) != last)  // checked here, on the rank's thread: no Catch2 assertion
            throw std::logic_error("step() updated on a micro-batch that is not its step's last, or not on the last");
          continue;
        }
        engine.backward(loss, double(end - begin) / 6.0);
      }
      if (how == Reduction::engine_counts) continue;
      if (how == Reduction::manual || how == Reduction::manual_twice) engine.reduce();
      if (how == Reduction::manual_twice) engine.reduce();
      engine.step(0.1);
    }
    auto params = engine.full_parameters();
    if (comm.rank() == 0) out = std::move(params);
  });
  return out;
}
}  // namespace

using Accumulating = std::tuple<DDP, ZeRO<1>, ZeRO<2>, Strategy<ShardParameters<true>, WrapByType<Block>>>;

TEMPLATE_LIST_TEST_CASE("no_sync accumulation equals one large batch", "[engine]", Accumulating) {
  const auto one_batch = accumulate<DDP>(1, 1);
  for (int world : {1, 3}) {
    CAPTURE(world);
    CHECK(test::max_difference(accumulate<TestType>(world, 2), one_batch) < 1e-6);
    CHECK(test::max_difference(accumulate<TestType>(world, 1), one_batch) < 1e-6);
  }
}

TEMPLATE_LIST_TEST_CASE("synchronising backward calls before one step add their gradients", "[engine]", Accumulating) {
  // As in PyTorch: without no_sync every backward reduces, and the reduced gradients add up.
  const auto one_batch = accumulate<DDP>(1, 1);
  for (int world : {1, 3}) {
    CAPTURE(world);
    CHECK(test::max_difference(accumulate<TestType>(world, 2, Reduction::every_backward), one_batch) < 1e-6);
    if (world == 1)
      CHECK(test::max_difference(accumulate<TestType>(world, 3, Reduction::every_backward), one_batch) < 1e-6);
  }
}

TEMPLATE_LIST_TEST_CASE("reduce() after backward passes under no_sync is the reduction of a backward outside it, "
                        "bit for bit",
                        "[engine]", Accumulating) {
  // FairScale ShardedDataParallel's reduce(): the accumulated local gradients reduced on demand.
  for (int world : {1, 3}) {
    CAPTURE(world);
    for (int micro : {1, 2}) {  // 3 rows a micro-batch: one a rank at world size 3
      CAPTURE(micro);
      const auto synced = accumulate<TestType>(world, micro);
      CHECK(test::max_difference(accumulate<TestType>(world, micro, Reduction::manual), synced) == 0);
      CHECK(test::max_difference(accumulate<TestType>(world, micro, Reduction::manual_twice), synced) == 0);
    }
  }
}

TEMPLATE_LIST_TEST_CASE("gradient_accumulation_steps: the engine's count of micro-batches is the no_sync loop, "
                        "bit for bit",
                        "[engine]", Accumulating) {
  // The rows of a micro-batch are a power of two, so the engine's weight / K is the loop's
  // weight exactly.
  for (int world : {1, 3}) {
    CAPTURE(world);
    const auto looped = accumulate<TestType>(world, 2);
    CHECK(test::max_difference(accumulate<TestType>(world, 2, Reduction::engine_counts), looped) == 0);
  }
  CHECK(test::max_difference(accumulate<TestType>(1, 3, Reduction::engine_counts), accumulate<TestType>(1, 3)) == 0);
  CHECK(test::max_difference(accumulate<TestType>(1, 1, Reduction::engine_counts), accumulate<TestType>(1, 1)) == 0);
}

using test::error_of;

TEST_CASE("gradient_accumulation_steps: a step's first micro-batches reduce nothing and update nothing", "[engine]") {
  // What rank 0 saw after each micro-batch of two steps of 3, the first step with a micro-batch
  // that zero_grad() dropped and that was done again.
  struct Seen {
    bool boundary_before, updated;
    int accumulated, optimizer_steps;
    double reduced_bytes, moved;  // bytes reduced since the step began; largest change of a parameter
  };
  std::vector<Seen> seen;
  int accumulated_after_zero_grad = -1;
  run_ranks(3, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    StrategyConfig config;
    config.gradient_accumulation_steps = 3;
    Engine<ZeRO<2>, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), config, 42);
    BatchSampler sampler(test::tiny_data(), 8, 3, 7);
    const auto initial = engine.full_parameters();
    std::vector<Seen> mine;
    auto micro_batch = [&](int m) {
      const Batch b = sampler.batch(m, comm.rank(), 3);
      const bool boundary = engine.is_gradient_accumulation_boundary();
      engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }));
      const bool updated = engine.step(0.1);
      const double reduced = engine.bytes_sent(CollectiveKind::AllReduce) +
                             engine.bytes_sent(CollectiveKind::ReduceScatter) +
                             engine.bytes_sent(CollectiveKind::Reduce);
      double moved = 0;  // test::max_difference asserts, which a rank's thread must not
      const auto now = engine.full_parameters();
      for (std::size_t p = 0; p < now.size(); ++p)
        for (std::size_t k = 0; k < now[p].second.size(); ++k)
          moved = std::max(moved, double(std::abs(now[p].second[k] - initial[p].second[k])));
      mine.push_back({boundary, updated, engine.accumulated_micro_batches(),
                      static_cast<int>(engine.optimizers()[0].step_count()), reduced, moved});
    };
    for (int step = 0; step < 2; ++step) {
      engine.reset_stats();
      for (int m = 0; m < 3; ++m) {
        micro_batch(3 * step + m);
        if (step == 0 && m == 0) {
          engine.zero_grad();
          if (comm.rank() == 0) accumulated_after_zero_grad = engine.accumulated_micro_batches();
          mine.pop_back();
          micro_batch(m);
        }
      }
    }
    if (comm.rank() == 0) seen = std::move(mine);
  });
  CHECK(accumulated_after_zero_grad == 0);
  REQUIRE(seen.size() == 6);
  for (std::size_t i = 0; i < seen.size(); ++i) {
    CAPTURE(i);
    const bool last = i % 3 == 2;
    const int steps_done = static_cast<int>(i / 3) + (last ? 1 : 0);
    CHECK(seen[i].boundary_before == last);
    CHECK(seen[i].updated == last);
    CHECK(seen[i].accumulated == (last ? 0 : static_cast<int>(i % 3) + 1));
    CHECK(seen[i].optimizer_steps == steps_done);
    CHECK((seen[i].reduced_bytes > 0) == last);
    CHECK((seen[i].moved > 1e-4) == (steps_done > 0));
  }
  std::string message;
  run_ranks(1, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    StrategyConfig config;
    config.gradient_accumulation_steps = 0;
    message = error_of([&] {
      Engine<ZeRO<2>, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), config);
    });
  });
  CHECK_THAT(message, Catch::Contains("gradient_accumulation_steps") && Catch::Contains("at least 1, got 0"));
}

TEST_CASE("stepping with unreduced no_sync gradients is an error", "[engine]") {
  std::string message;
  run_ranks(1, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<DDP, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    BatchSampler sampler(test::tiny_data(), 8, 2, 7);
    const Batch b = sampler.batch(0);
    {
      auto no_sync = engine.no_sync();
      engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }));
    }
    message = error_of([&] { engine.step(0.1); });
  });
  CHECK_THAT(message, Catch::Contains("no_sync"));
}

TEST_CASE("a sharded parameter used outside the engine's forward is a clear error", "[engine]") {
  std::vector<std::string> messages(2);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<Strategy<ShardParameters<true>, WrapByType<Block>>, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(
        model, comm, test::momentum_sgd(), {}, 42);
    BatchSampler sampler(test::tiny_data(), 8, 2, 7);
    const Batch b = sampler.batch(0);
    messages[static_cast<std::size_t>(comm.rank())] = error_of([&] { model.loss(b.inputs, b.targets); });
  });
  for (const auto& m : messages) CHECK_THAT(m, Catch::Contains("has no storage here"));
}

namespace {
/// Two steps of SGD with momentum on batches of 6 rows; before each step's backward, when
/// `discarded` is set, one backward on another batch (under no_sync, or reducing), then
/// zero_grad() when `zero` is set.
template <class S>
test::Parameters with_discarded_backward(int world, bool discarded, bool under_no_sync, bool zero) {
  test::Parameters out;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), {}, 42);
    BatchSampler sampler(test::tiny_data(), 8, 6, 7);
    for (int step = 0; step < 2; ++step) {
      if (discarded) {
        const Batch other = sampler.batch(10 + step, comm.rank(), world);
        std::optional<typename decltype(engine)::NoSync> no_sync;
        if (under_no_sync) no_sync.emplace(engine);
        engine.backward(engine.forward([&] { return model.loss(other.inputs, other.targets); }));
        no_sync.reset();
        if (zero) engine.zero_grad();
      }
      const Batch b = sampler.batch(step, comm.rank(), world);
      engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }),
                      double(b.inputs.size(0)) / 6.0);
      engine.step(0.1);
    }
    auto params = engine.full_parameters();
    if (comm.rank() == 0) out = std::move(params);
  });
  return out;
}
}  // namespace

TEMPLATE_LIST_TEST_CASE("zero_grad forgets the gradients of earlier backward passes, reduced or under no_sync",
                        "[engine]", Accumulating) {
  const int world = GENERATE(1, 3);
  const bool under_no_sync = GENERATE(true, false);
  CAPTURE(world, under_no_sync);
  const test::Parameters clean = with_discarded_backward<TestType>(world, false, false, false);
  CHECK(test::max_difference(with_discarded_backward<TestType>(world, true, under_no_sync, true), clean) == 0.0);
  // Without zero_grad the discarded gradients add to the step's, as PyTorch's would.
  CHECK(test::max_difference(with_discarded_backward<TestType>(world, true, under_no_sync, false), clean) > 1e-4);
}

// FairScale's zero_grad(set_to_none=False), the default: a parameter no backward reached since
// zero_grad still has a gradient, of zeros, and the optimizer steps it. Every rank leaves block 0
// out of the forward, so its parameters get no gradient; SGD then moves them by its weight decay
// alone (PyTorch's, added to the gradient): w(1 - lr wd) after each step, never left as they
// were, as set_to_none=True would leave a parameter whose gradient is None.
TEMPLATE_TEST_CASE("a parameter without a gradient steps with a zero one (zero_grad's set_to_none=False)", "[engine]",
                   DDP, ZeRO<1>, ZeRO<2>) {
  const int world = GENERATE(1, 2);
  CAPTURE(world);
  const SgdConfig sgd{.lr = 0.05, .weight_decay = 0.1};  // no momentum
  std::vector<std::pair<std::string, std::vector<float>>> before, after_one, after_two;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<TestType, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, sgd, {}, 42);
    auto seen = engine.full_parameters();
    for (int step = 0; step < 2; ++step) {
      engine.zero_grad();
      const Batch b = BatchSampler(test::tiny_data(), 8, 6, 7).batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return test::loss_skipping_block0(model, b, true); });
      engine.backward(loss, 1.0 / world);
      loss = Var<float>();
      engine.step(sgd.lr);
      auto now = engine.full_parameters();
      if (comm.rank() == 0) (step == 0 ? after_one : after_two) = std::move(now);
    }
    if (comm.rank() == 0) before = std::move(seen);
  });
  const double keep = 1.0 - sgd.lr * sgd.weight_decay;
  std::size_t checked = 0, moved = 0, off = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (before[i].first.rfind("transformer.h.0.", 0) != 0) continue;
    for (std::size_t j = 0; j < before[i].second.size(); ++j, ++checked) {
      const double w = before[i].second[j];
      if (after_one[i].second[j] != before[i].second[j]) ++moved;
      if (std::abs(after_one[i].second[j] - w * keep) > 1e-6 * std::abs(w) + 1e-12 ||
          std::abs(after_two[i].second[j] - w * keep * keep) > 2e-6 * std::abs(w) + 1e-12)
        ++off;
    }
  }
  CHECK(checked > 100);  // block 0: its attention, MLP and layer norms
  CHECK(moved > checked / 2);
  CHECK(off == 0);
}
