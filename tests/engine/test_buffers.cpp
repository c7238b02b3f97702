// Module buffers under the engine: a running mean kept whole on every rank beside sharded
// parameters, broadcast from rank 0 at start-up (sync_models_at_startup) and before each forward
// (broadcast_buffers), and on demand (sync_buffers()); checked against the running mean worked
// out from the batches themselves, and the training against one process. Checkpoints hold rank
// 0's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <vector>

#include "engine_fixture.hpp"
#include "io/temp_dir.hpp"
#include "support/error_of.hpp"
#include "polyshard/io/io.hpp"

using namespace polyshard;

namespace {

constexpr std::int64_t vocabulary = 13, channels = 7;
constexpr int steps = 3, global_rows = 6;
constexpr double momentum = 0.25;

/// Tracks the mean over batch and time of each channel of its input, as batch norm's running
/// mean does, and passes the input on unchanged; counts the batches it saw.
template <FloatElement T, Device D = Cpu>
struct RunningMean {
  BOOST_HANA_DEFINE_STRUCT(RunningMean, (Buffer<float, D>, running_mean), (Buffer<std::int64_t, D>, batches_seen));

  RunningMean() = default;
  explicit RunningMean(std::int64_t width) : running_mean({width}, 0.0f), batches_seen({1}, 0) {}

  /// x: (B, T, C) -> x.
  Var<T, D> operator()(const Var<T, D>& x) const {
    const Tensor<T, D> v = x.value().contiguous();
    const std::int64_t c = v.shape()[2], rows = v.numel() / c;
    float* mean = running_mean.value().data();
    for (std::int64_t j = 0; j < c; ++j) {
      double sum = 0;
      for (std::int64_t i = 0; i < rows; ++i) sum += double(v.data()[i * c + j]);
      mean[j] = float((1 - momentum) * double(mean[j]) + momentum * sum / double(rows));
    }
    ++batches_seen.value().data()[0];
    return x;
  }
};

template <FloatElement T, Device D = Cpu>
struct Layer {
  BOOST_HANA_DEFINE_STRUCT(Layer, (LayerNorm<T, D>, norm), (Linear<T, D>, proj));
  Layer() = default;
  explicit Layer(std::int64_t dim) : norm(dim), proj(dim, dim) {}
  Var<T, D> operator()(const Var<T, D>& x) const { return add(x, call(proj, call(norm, x))); }
};

/// A frozen embedding (so that what the running mean sees is known from the token ids alone),
/// the running mean, two residual layers and a head.
struct Model {
  BOOST_HANA_DEFINE_STRUCT(Model, (Embedding<float>, embed), (RunningMean<float>, running),
                           (std::vector<Layer<float>>, layers), (Linear<float>, head));
  Model() : embed(vocabulary, channels), running(channels), head(channels, vocabulary) {
    for (int i = 0; i < 2; ++i) layers.emplace_back(channels);
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  Var<float> loss(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets) const {
    Var<float> x = running(embed(ids));
    for (const auto& layer : layers) x = call(layer, x);
    return cross_entropy(call(head, x), targets);
  }
};

struct Run {
  test::Parameters parameters;
  std::vector<double> losses;
  std::vector<float> start_mean, mean, synced_mean;  // after construction, after training, after sync_buffers()
  std::int64_t batches_seen = 0;
};

/// Trains Model for `steps` steps on every rank of `world`, rank r's buffers starting at r + j.
template <class S>
std::vector<Run> train(int world, StrategyConfig config = {}) {
  std::vector<Run> runs(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Run& run = runs[static_cast<std::size_t>(comm.rank())];
    Model model;
    model.embed.weight.set_requires_grad(false);
    for (std::int64_t j = 0; j < channels; ++j) model.running.running_mean.value().data()[j] = float(comm.rank() + j);
    const SgdConfig sgd = test::momentum_sgd();
    Engine<S, Model, ThreadCommunicator, Sgd<float>> engine(model, comm, sgd, config, 42);
    run.start_mean = model.running.running_mean.value().to_vector();
    BatchSampler sampler(test::tiny_data(), 8, global_rows, 7);
    const RowRange rows = rank_rows(global_rows, comm.rank(), world);
    const double weight = double(rows.end - rows.begin) / global_rows;
    for (int step = 0; step < steps; ++step) {
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      run.losses.push_back(loss.item() * weight);
      engine.backward(loss, weight);
      loss = Var<float>();
      engine.step(sgd.lr);
    }
    run.mean = model.running.running_mean.value().to_vector();
    run.batches_seen = model.running.batches_seen.value().data()[0];
    engine.sync_buffers(/*blocking=*/true);
    run.synced_mean = model.running.running_mean.value().to_vector();
    run.parameters = engine.full_parameters();
  });
  return runs;
}

/// The oracle: rank `rank`'s running mean after `steps` forwards, from its initial values and
/// the rows of the frozen embedding its token ids pick, in double. `from_rank` names the rank
/// whose batches each forward but the last starts from (rank 0 when buffers are broadcast).
std::vector<double> expected_mean(const std::vector<float>& table, int world, int rank, std::vector<double> mean,
                                  int from_rank) {
  BatchSampler sampler(test::tiny_data(), 8, global_rows, 7);
  for (int step = 0; step < steps; ++step) {
    const int r = step + 1 < steps ? from_rank : rank;
    const Batch b = sampler.batch(step, r, world);
    const auto ids = b.inputs.to_vector();
    for (std::int64_t j = 0; j < channels; ++j) {
      double sum = 0;
      for (const std::int32_t id : ids) sum += double(table[std::size_t(id * channels + j)]);
      mean[std::size_t(j)] = (1 - momentum) * mean[std::size_t(j)] + momentum * sum / double(ids.size());
    }
  }
  return mean;
}

const std::vector<float>& named(const test::Parameters& parameters, const std::string& name) {
  for (const auto& [n, values] : parameters)
    if (n == name) return values;
  FAIL("no parameter " << name);
  throw;
}

double max_gap(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double gap = 0;
  for (std::size_t j = 0; j < got.size(); ++j) gap = std::max(gap, std::abs(double(got[j]) - want[j]));
  return gap;
}

std::vector<double> initial_mean(int rank) {
  std::vector<double> m;
  for (std::int64_t j = 0; j < channels; ++j) m.push_back(double(rank + j));
  return m;
}

/// A config under which each rank keeps buffers of its own (no broadcast at start-up or before a
/// forward), so that rank 0's can be told apart from the others'.
StrategyConfig own_buffers() {
  StrategyConfig config;
  config.sync_models_at_startup = false;
  config.broadcast_buffers = false;
  return config;
}

/// Gives `model` buffers that differ by rank: running mean 10 * rank + j + 0.5, 5 + rank batches.
void fill_buffers_of_rank(Model& model, int rank) {
  for (std::int64_t j = 0; j < channels; ++j)
    model.running.running_mean.value().data()[j] = float(10 * rank + j) + 0.5f;
  model.running.batches_seen.value().data()[0] = 5 + rank;
}

}  // namespace

TEMPLATE_TEST_CASE("module buffers stay whole on every rank, follow rank 0 before each forward, and training matches "
                   "one process",
                   "[engine][buffers]", DDP, ZeRO<2>, ZeRO<3>, (Strategy<ShardParameters<true>, WrapByType<Layer>>)) {
  const std::vector<Run> one = train<DDP>(1);
  const std::vector<float> table = named(one[0].parameters, "embed.weight");
  CHECK(max_gap(one[0].mean, expected_mean(table, 1, 0, initial_mean(0), 0)) < 1e-5);
  const int world = 3;
  const std::vector<Run> runs = train<TestType>(world);
  // Rank 0's buffers reached every rank at start-up; each forward started from rank 0's.
  const std::vector<double> rank0 = expected_mean(table, world, 0, initial_mean(0), 0);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    const Run& run = runs[std::size_t(r)];
    CHECK(max_gap(run.start_mean, initial_mean(0)) == 0);
    CHECK(max_gap(run.mean, expected_mean(table, world, r, initial_mean(0), 0)) < 1e-5);
    CHECK(run.synced_mean == runs[0].mean);  // sync_buffers(): rank 0's, bit for bit
    CHECK(run.batches_seen == steps);
    CHECK(test::max_difference(run.parameters, one[0].parameters) < 1e-6);
  }
  CHECK(max_gap(runs[0].mean, rank0) < 1e-5);
  CHECK(max_gap(runs[1].mean, rank0) > 1e-3);  // its last batch is its own: the oracle can tell ranks apart
  for (int s = 0; s < steps; ++s) {
    double loss = 0;
    for (const Run& run : runs) loss += run.losses[std::size_t(s)];
    CHECK(loss == Approx(one[0].losses[std::size_t(s)]).epsilon(1e-6));
  }
}

TEST_CASE("without broadcast_buffers and sync_models_at_startup each rank's buffers follow its own batches",
          "[engine][buffers]") {
  StrategyConfig config;
  config.broadcast_buffers = false;
  config.sync_models_at_startup = false;
  const int world = 3;
  const std::vector<Run> runs = train<ZeRO<2>>(world, config);
  const std::vector<float> table = named(runs[0].parameters, "embed.weight");
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    const Run& run = runs[std::size_t(r)];
    CHECK(max_gap(run.start_mean, initial_mean(r)) == 0);
    CHECK(max_gap(run.mean, expected_mean(table, world, r, initial_mean(r), r)) < 1e-5);
    CHECK(run.synced_mean == runs[0].mean);  // sync_buffers() still broadcasts on demand
  }
}

TEST_CASE("sync_buffers() returns before the other ranks join its broadcasts (FairScale's default, blocking=False), "
          "the buffers are rank 0's once waited for, and forward waits for them",
          "[engine][buffers]") {
  // Rank 1 joins the broadcasts only once rank 0's call has returned, or after 30 s (a call
  // that waited for them would return only then, once rank 1 joins).
  std::promise<void> rank0_returned;
  std::shared_future<void> returned = rank0_returned.get_future().share();
  bool returned_first = false;
  std::vector<std::vector<float>> means(2), means_in_forward(2);
  std::vector<std::int64_t> seen(2);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    const int r = comm.rank();
    Model model;
    fill_buffers_of_rank(model, r);
    const SgdConfig sgd = test::momentum_sgd();
    Engine<ZeRO<3>, Model, ThreadCommunicator, Sgd<float>> engine(model, comm, sgd, own_buffers(), 42);
    if (r == 0) {
      engine.sync_buffers();
      rank0_returned.set_value();
    } else {
      returned_first = returned.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
      engine.sync_buffers(/*blocking=*/true);
    }
    // A forward reads the buffers after the broadcasts have ended: the running mean it starts
    // from is rank 0's.
    BatchSampler sampler(test::tiny_data(), 8, global_rows, 7);
    const Batch b = sampler.batch(0, r, 2);
    std::vector<float> before;
    Var<float> loss = engine.forward([&] {
      before = model.running.running_mean.value().to_vector();
      return model.loss(b.inputs, b.targets);
    });
    means_in_forward[std::size_t(r)] = before;
    engine.backward(loss, 0.5);
    loss = Var<float>();
    engine.sync_buffers();
    engine.wait_for_buffers();
    means[std::size_t(r)] = model.running.running_mean.value().to_vector();
    seen[std::size_t(r)] = model.running.batches_seen.value().data()[0];
  });
  INFO("rank 0's sync_buffers() returned before rank 1 joined its broadcasts: " << returned_first);
  CHECK(returned_first);
  for (std::int64_t j = 0; j < channels; ++j) CHECK(means_in_forward[0][std::size_t(j)] == float(j) + 0.5f);
  CHECK(means_in_forward[1] == means_in_forward[0]);
  CHECK(means[1] == means[0]);  // rank 0's after its own forward, bit for bit
  CHECK(seen[0] == 6);           // 5, and rank 0's forward
  CHECK(seen[1] == 6);           // rank 0's count, an integer buffer sent as bytes
}

TEST_CASE("a checkpoint holds rank 0's persistent buffers, loads them into every rank and names a missing one",
          "[engine][buffers][io]") {
  TempDir dir;
  const StrategyConfig config = own_buffers();
  const SgdConfig sgd = test::momentum_sgd();
  std::vector<std::vector<float>> loaded(2);
  std::vector<std::int64_t> seen(2);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    {
      Model model;
      fill_buffers_of_rank(model, comm.rank());
      Engine<ZeRO<2>, Model, ThreadCommunicator, Sgd<float>> engine(model, comm, sgd, config, 42);
      save_checkpoint(engine, dir / "checkpoint");
    }
    Model fresh;
    Engine<ZeRO<2>, Model, ThreadCommunicator, Sgd<float>> engine(fresh, comm, sgd, config, 7);
    load_checkpoint(engine, dir / "checkpoint");
    loaded[std::size_t(comm.rank())] = fresh.running.running_mean.value().to_vector();
    seen[std::size_t(comm.rank())] = fresh.running.batches_seen.value().data()[0];
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(loaded[std::size_t(r)] == std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f});
    CHECK(seen[std::size_t(r)] == 5);
  }
  REQUIRE(std::filesystem::remove(dir / "checkpoint" / "buffers.safetensors"));
  std::vector<std::string> errors(2);
  run_ranks(2, [&](ThreadCommunicator& comm) {
    Model fresh;
    Engine<ZeRO<2>, Model, ThreadCommunicator, Sgd<float>> engine(fresh, comm, sgd, config, 7);
    errors[std::size_t(comm.rank())] = test::error_of([&] { load_checkpoint(engine, dir / "checkpoint"); });
    loaded[std::size_t(comm.rank())] = fresh.running.running_mean.value().to_vector();
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(errors[std::size_t(r)], Catch::Contains("missing buffers") && Catch::Contains("running.running_mean") &&
                                           Catch::Contains("running.batches_seen"));
    CHECK(loaded[std::size_t(r)] == std::vector<float>(channels, 0.0f));  // nothing written
  }
}

TEST_CASE("full weights hold rank 0's persistent buffers beside the parameters, load them into every rank and name "
          "a missing or different one",
          "[engine][buffers][io]") {
  TempDir dir;
  const StrategyConfig config = own_buffers();
  const SgdConfig sgd = test::momentum_sgd();
  const int world = 3;
  const std::filesystem::path path = dir / "full.safetensors";
  std::vector<test::Parameters> saved(world), loaded_parameters(world);
  std::vector<std::vector<float>> loaded(world);
  std::vector<std::int64_t> seen(world);
  run_ranks(world, [&](ThreadCommunicator& comm) {
    const auto r = std::size_t(comm.rank());
    {
      Model model;
      fill_buffers_of_rank(model, comm.rank());
      Engine<ZeRO<3>, Model, ThreadCommunicator, Sgd<float>> engine(model, comm, sgd, config, 42);
      save_full_weights(engine, path);
      saved[r] = engine.full_parameters();
    }
    Model fresh;
    Engine<DDP, Model, ThreadCommunicator, Sgd<float>> engine(fresh, comm, sgd, config, 7);
    load_full_weights(engine, path);
    loaded[r] = fresh.running.running_mean.value().to_vector();
    seen[r] = fresh.running.batches_seen.value().data()[0];
    loaded_parameters[r] = engine.full_parameters();
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(loaded[std::size_t(r)] == std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f});
    CHECK(seen[std::size_t(r)] == 5);
    CHECK(test::max_difference(loaded_parameters[std::size_t(r)], saved[0]) == 0);
  }
  // The same state dict with one buffer left out and the other in another dtype.
  const SafetensorsFile full = SafetensorsFile::open(path);
  SafetensorsWriter writer;
  for (const SafetensorsTensorInfo& t : full.tensors())
    if (t.name == "running.running_mean") writer.add(t.name, full.read<double>(t.name, DTypeConversion::convert));
    else if (t.name != "running.batches_seen") writer.add(t.name, full.read<float>(t.name));
  writer.write(dir / "edited.safetensors");
  std::vector<std::string> errors(world);
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Model fresh;
    Engine<DDP, Model, ThreadCommunicator, Sgd<float>> engine(fresh, comm, sgd, config, 7);
    errors[std::size_t(comm.rank())] = test::error_of([&] { load_full_weights(engine, dir / "edited.safetensors"); });
    loaded[std::size_t(comm.rank())] = fresh.running.running_mean.value().to_vector();
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK_THAT(errors[std::size_t(r)],
               Catch::Contains("missing tensors 'running.batches_seen'") &&
                   Catch::Contains("different shapes or dtypes for buffers 'running.running_mean (F64 (7,) in the "
                                   "file, F32 (7,) in the model)'"));
    CHECK(loaded[std::size_t(r)] == std::vector<float>(channels, 0.0f));  // nothing written
  }
}

namespace {
/// What each of two ranks held of the parameters (by name, as float) once the engine was built
/// and after one SGD step, rank r's model initialised from seed `seed(r)`.
struct TwoRanks {
  std::vector<std::vector<std::pair<std::string, std::vector<float>>>> built{2}, stepped{2};
};
template <class S, class Seed>
TwoRanks two_ranks_from(Seed seed, bool sync) {
  TwoRanks seen;
  StrategyConfig config;
  config.sync_models_at_startup = sync;
  run_ranks(2, [&](ThreadCommunicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), config,
                                                                   seed(comm.rank()));
    seen.built[r] = engine.full_parameters();
    const Batch b = BatchSampler(test::tiny_data(), 8, 6, 7).batch(0, comm.rank(), 2);
    Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
    engine.backward(loss, 0.5);
    loss = Var<float>();
    engine.step(0.1);
    seen.stepped[r] = engine.full_parameters();
  });
  return seen;
}
}  // namespace

// FairScale's sync_models_at_startup on the parameters, under the policies that keep them whole
// (a sharded one builds each shard from one init), in bf16 too, whose fp32 masters are a copy of
// their own: ranks initialised from different seeds hold rank 0's parameters once the engine is
// built, master weights included, and then step as ranks initialised alike do. Without it each
// rank keeps its own.
TEMPLATE_TEST_CASE("sync_models_at_startup gives every rank rank 0's parameters and masters when their inits differ",
                   "[engine][buffers]", DDP, ZeRO<1>, ZeRO<2>, (Strategy<ShardGradients, Bf16Mixed>)) {
  const auto own_seed = [](int rank) { return std::uint64_t(42 + 1000 * rank); };
  const auto rank0_seed = [](int) { return std::uint64_t(42); };
  const TwoRanks alike = two_ranks_from<TestType>(rank0_seed, false);
  REQUIRE(alike.built[0] == alike.built[1]);

  const TwoRanks synced = two_ranks_from<TestType>(own_seed, true);
  CHECK(synced.built[0] == alike.built[0]);
  CHECK(synced.built[1] == alike.built[0]);
  CHECK(synced.stepped[1] == synced.stepped[0]);
  if constexpr (TestType::precision::mixed) {
    // A separate fp32 master copy is re-derived from rank 0's bf16 parameters where it differed
    // (rank 0's own keeps its fp32 init): the step lands within one bf16 rounding of the run
    // initialised alike, elementwise.
    std::size_t outside = 0, compared = 0;
    for (std::size_t i = 0; i < alike.stepped[0].size(); ++i)
      for (std::size_t j = 0; j < alike.stepped[0][i].second.size(); ++j, ++compared) {
        const double a = synced.stepped[0][i].second[j], b = alike.stepped[0][i].second[j];
        if (std::abs(a - b) > std::ldexp(std::max(std::abs(a), std::abs(b)), -7) + 1e-12) ++outside;
      }
    CHECK(compared > 0);
    CHECK(outside == 0);
  } else {
    CHECK(synced.stepped[0] == alike.stepped[0]);  // the masters the step updated were rank 0's
  }

  const TwoRanks apart = two_ranks_from<TestType>(own_seed, false);
  CHECK(apart.built[0] == alike.built[0]);
  CHECK(apart.built[1] != apart.built[0]);
  if constexpr (TestType::sharding::shards_optimizer_state) {
    // Each rank's shard of the masters came from its own init; the all-gather after the step
    // gives both ranks the same mix of the two, which is neither rank 0's run nor the other's.
    CHECK(apart.stepped[1] == apart.stepped[0]);
    CHECK(apart.stepped[0] != alike.stepped[0]);
  } else {
    CHECK(apart.stepped[1] != apart.stepped[0]);
  }
}
