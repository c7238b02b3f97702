// Gradient buckets: how units are cut, that every sharding gives the same bits whatever the
// buckets and whether they overlap backward, and that buckets are reduced while backward runs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <memory>

#include "engine_fixture.hpp"
#include "polyshard/engine/gradient_buckets.hpp"

using namespace polyshard;
using namespace polyshard::test;

TEST_CASE("units are cut into buckets of whole parameters from the end, the padding in the first", "[engine]") {
  // Parameters of 4, 3, 5 and 2 elements at offsets 0, 4, 7, 12; 14 elements, padded to 16.
  const std::vector<std::int64_t> offsets{0, 4, 7, 12}, sizes{4, 3, 5, 2};
  const auto cut = [&](std::int64_t cap) {
    std::vector<std::tuple<std::int64_t, std::int64_t, std::size_t, std::size_t>> out;
    for (const GradientBucket& b : plan_gradient_buckets(offsets, sizes, 16, cap))
      out.emplace_back(b.begin, b.end, b.first, b.last);
    return out;
  };
  using B = std::vector<std::tuple<std::int64_t, std::int64_t, std::size_t, std::size_t>>;
  CHECK(cut(0) == B{{0, 16, 0, 4}});    // no cap: the whole unit
  CHECK(cut(100) == B{{0, 16, 0, 4}});  // everything fits
  CHECK(cut(7) == B{{7, 16, 2, 4}, {0, 7, 0, 2}});
  CHECK(cut(8) == B{{7, 16, 2, 4}, {0, 7, 0, 2}});   // 5 + 2 fit, 3 more would not
  CHECK(cut(10) == B{{4, 16, 1, 4}, {0, 4, 0, 1}});  // 3 + 5 + 2
  CHECK(cut(1) == B{{12, 16, 3, 4}, {7, 12, 2, 3}, {4, 7, 1, 2}, {0, 4, 0, 1}});  // one parameter each, however large
  CHECK(plan_gradient_buckets({}, {}, 4, 3).size() == 1);  // a unit of padding only
}

TEST_CASE("a bucket holds the smallest of the caps set: bucket_cap_mb MiB of the reduce type, reduce_bucket_size "
          "elements", "[engine]") {
  StrategyConfig c;
  CHECK(gradient_bucket_elements(c, 4) == 0);  // none set (Engine fills the reference's in first): one a unit
  c.bucket_cap_mb = 25;
  CHECK(gradient_bucket_elements(c, 4) == 25 * 1024 * 1024 / 4);  // PyTorch's and FairScale's 25 MB
  CHECK(gradient_bucket_elements(c, 2) == 25 * 1024 * 1024 / 2);
  c.reduce_bucket_size = 1000;  // a DeepSpeed setting, in elements: both set, the smaller
  CHECK(gradient_bucket_elements(c, 4) == 1000);
  c.bucket_cap_mb = 0.001;
  CHECK(gradient_bucket_elements(c, 4) == 262);
  c.bucket_cap_mb = 0;  // bucket_cap_mb's "no cap" leaves reduce_bucket_size's
  CHECK(gradient_bucket_elements(c, 4) == 1000);
  c = {};
  c.bucket_cap_mb = 0;  // alone: one bucket a unit
  CHECK(gradient_bucket_elements(c, 4) == 0);
  c.reduce_bucket_size = 0;
  CHECK_THROWS_WITH(gradient_bucket_elements(c, 4), Catch::Contains("reduce_bucket_size = 0"));
}

TEST_CASE("reduce_buffer_size caps a bucket in elements as FairScale's does, 0 reducing each parameter alone",
          "[engine]") {
  StrategyConfig c;
  c.reduce_buffer_size = fairscale_reduce_buffer_size;  // 2^23 elements: more than 25 MiB of floats
  CHECK(gradient_bucket_elements(c, 4) == 8'388'608);
  c.reduce_buffer_size = 0;  // no batching: a cap of one element, so each parameter is a bucket of its own
  CHECK(gradient_bucket_elements(c, 4) == 1);
  c.reduce_buffer_size = 1000;
  c.bucket_cap_mb = 0.001;  // with another cap set: the smallest
  CHECK(gradient_bucket_elements(c, 4) == 262);
  c.reduce_bucket_size = 100;
  CHECK(gradient_bucket_elements(c, 4) == 100);
  c.bucket_cap_mb = 0;  // bucket_cap_mb's "no cap" leaves the others'
  CHECK(gradient_bucket_elements(c, 4) == 100);
  c.reduce_buffer_size = -1;
  CHECK_THROWS_WITH(gradient_bucket_elements(c, 4), Catch::Contains("reduce_buffer_size = -1"));
}

TEST_CASE("a preset buckets as its reference does where the config sets no cap: DDP and FSDP 25 MiB, ShardedDDP "
          "2^23 elements, the ZeRO presets 2e8", "[engine]") {
  const auto cap_of = []<class S>(S, StrategyConfig c = {}) {
    return gradient_bucket_elements(with_reference_defaults<S>(c), sizeof(typename S::reduce_type));
  };
  const std::int64_t torch = 25 * 1024 * 1024 / 4;
  CHECK(cap_of(DDP{}) == torch);
  CHECK(cap_of(FSDP{}) == torch);
  CHECK(cap_of(Strategy<ShardGradients>{}) == torch);  // a composition of one's own: the family's default
  CHECK(cap_of(Strategy<NoShard, Bf16Mixed>{}) == 2 * torch);  // MiB of the 16-bit reduce type
  CHECK(cap_of(ShardedDDP{}) == 8'388'608);
  for (const std::int64_t cap : {cap_of(ZeRO<0>{}), cap_of(ZeRO<1>{}), cap_of(ZeRO<2>{}), cap_of(ZeRO<3>{}),
                                 cap_of(ZeROOffload{}), cap_of(ZeROInfinity{}), cap_of(ZeROInfinityParameters{})})
    CHECK(cap == 200'000'000);
  // A cap the user sets replaces the reference's instead of joining it.
  StrategyConfig one_mib;
  one_mib.bucket_cap_mb = 1;
  CHECK(cap_of(ZeRO<2>{}, one_mib) == 262'144);
  CHECK(cap_of(ShardedDDP{}, one_mib) == 262'144);
  StrategyConfig elements;
  elements.reduce_bucket_size = 1000;
  CHECK(cap_of(DDP{}, elements) == 1000);
  CHECK_FALSE(with_reference_defaults<DDP>(elements).bucket_cap_mb.has_value());
}

TEST_CASE("the engine cuts its buckets with the preset's reference cap, and config() shows it filled in", "[engine]") {
  // One block 960 wide, 11.1M elements: its two MLP matrices (3.7M each) fit together in 2^23
  // elements (8,388,608) but not in 25 MiB of floats (6,553,600), and the model in 2e8, so the
  // three caps cut it differently.
  const GptConfig wide{.vocab_size = 64, .block_size = 4, .n_layer = 1, .n_head = 4, .n_embd = 960};
  struct Cut {
    std::size_t buckets;
    StrategyConfig config;
  };
  const auto cut = []<class S>(S, const GptConfig& cfg, StrategyConfig config = {}) {
    Cut out{};
    run_ranks(1, [&](ThreadCommunicator& comm) {
      Gpt<float> model(cfg);
      Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, SgdConfig{}, config, 1);
      out = {engine.gradient_buckets(0).size(), engine.config()};
    });
    return out;
  };
  const Cut ddp = cut(DDP{}, wide), sharded = cut(ShardedDDP{}, wide), zero = cut(ZeRO<2>{}, wide);
  CHECK(ddp.config.bucket_cap_mb == 25);
  CHECK(sharded.config.reduce_buffer_size == fairscale_reduce_buffer_size);
  CHECK(zero.config.reduce_bucket_size == 200'000'000);
  CHECK_FALSE((ddp.config.reduce_bucket_size || ddp.config.reduce_buffer_size || sharded.config.bucket_cap_mb ||
               sharded.config.reduce_bucket_size || zero.config.bucket_cap_mb || zero.config.reduce_buffer_size));
  // The counts the same caps give when the config sets them; the three differ.
  StrategyConfig torch, fairscale;
  torch.bucket_cap_mb = 25;
  fairscale.reduce_buffer_size = fairscale_reduce_buffer_size;
  CHECK(ddp.buckets == cut(ZeRO<2>{}, wide, torch).buckets);
  CHECK(sharded.buckets == cut(DDP{}, wide, fairscale).buckets);
  CHECK(zero.buckets == 1);
  CHECK(ddp.buckets > sharded.buckets);
  CHECK(sharded.buckets > zero.buckets);
}

namespace {
/// One parameter a bucket (bucket_cap_mb of one element), or one bucket a unit; reductions
/// overlapped with backward or issued when the unit's backward is done.
StrategyConfig buckets(double cap_mb, bool overlap) {
  StrategyConfig c;
  c.bucket_cap_mb = cap_mb;
  c.overlap_comm = overlap;
  return c;
}
constexpr double one_element = 1e-9;

/// Two micro-batches a step, the first under no_sync or not (its reduced gradients are carried
/// over the second backward): the parameters after `steps` steps, gathered.
template <class S>
Parameters train_accumulating(int world, bool first_under_no_sync, const StrategyConfig& config, int steps = 2) {
  std::vector<Parameters> out(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Sgd<float>> engine(model, comm, momentum_sgd(), config, 42);
    BatchSampler sampler(tiny_data(), 8, 2 * world, 7);
    for (int step = 0; step < steps; ++step) {
      for (int micro = 0; micro < 2; ++micro) {
        const Batch b = sampler.batch(2 * step + micro, comm.rank(), world);
        Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
        if (micro == 0 && first_under_no_sync) {
          auto scope = engine.no_sync();
          engine.backward(loss, 0.5 / world);
        } else {
          engine.backward(loss, 0.5 / world);
        }
      }
      engine.step(0.1);
    }
    out[static_cast<std::size_t>(comm.rank())] = engine.full_parameters();
  });
  return out[0];
}
}  // namespace

/// Each way a bucket is reduced: in place or from a 16-bit copy, to every rank or to its owners,
/// in one unit or in nested ones, and around checkpointed blocks (whose parameters backward
/// finishes inside the checkpoints' own sweeps).
using BucketedStrategies =
    std::tuple<DDP, DdpPerBlock, ZeRO<1>, ZeRO<2>, FsdpPerBlock, ZeRO3Checkpointed, Strategy<NoShard, Bf16Mixed>,
               Strategy<ShardOptimizerState, Bf16Mixed>, Strategy<ShardGradients, Bf16Mixed>>;

TEMPLATE_LIST_TEST_CASE("buckets of one parameter, overlapped or not, give the bits of one reduction a unit",
                        "[engine]", BucketedStrategies) {
  using S = TestType;
  const auto inf = std::numeric_limits<double>::infinity();
  for (const int world : {1, 2, 3}) {
    INFO("world size " << world);
    const RunResult whole = train<S>(world, 3, 6, momentum_sgd(), inf, buckets(0, true));
    const RunResult overlapped = train<S>(world, 3, 6, momentum_sgd(), inf, buckets(one_element, true));
    const RunResult at_unit_end = train<S>(world, 3, 6, momentum_sgd(), inf, buckets(one_element, false));
    CHECK(max_difference(overlapped.parameters, whole.parameters) == 0.0);
    CHECK(max_difference(at_unit_end.parameters, whole.parameters) == 0.0);
    CHECK(overlapped.losses == whole.losses);
    // And training moved the parameters.
    CHECK(max_difference(whole.parameters, train<S>(world, 0).parameters) > 1e-3);
  }
}

TEMPLATE_LIST_TEST_CASE("accumulated micro-batches reduce to the same bits in buckets, under no_sync or not",
                        "[engine]", BucketedStrategies) {
  using S = TestType;
  for (const bool no_sync : {false, true}) {
    INFO((no_sync ? "first micro-batch under no_sync" : "two synchronised backwards"));
    const Parameters whole = train_accumulating<S>(3, no_sync, buckets(0, true));
    CHECK(max_difference(train_accumulating<S>(3, no_sync, buckets(one_element, true)), whole) == 0.0);
    CHECK(max_difference(train_accumulating<S>(3, no_sync, buckets(one_element, false)), whole) == 0.0);
  }
}

namespace {
/// A ThreadCommunicator that calls `on_reduce` as each reducing collective is issued.
class WatchedCommunicator {
 public:
  explicit WatchedCommunicator(ThreadCommunicator& inner) : inner_(&inner) {}
  std::function<void()> on_reduce;

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  template <FloatElement T>
  void all_reduce(std::span<T> b, ReduceOp op = ReduceOp::Sum) {
    issued();
    inner_->all_reduce(b, op);
  }
  template <FloatElement T>
  CommHandle all_reduce_async(std::span<T> b, ReduceOp op = ReduceOp::Sum) {
    issued();
    return inner_->all_reduce_async(b, op);
  }
  template <FloatElement T>
  void reduce_scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, ReduceOp op = ReduceOp::Sum) {
    issued();
    inner_->reduce_scatter<T>(in, out, op);
  }
  template <FloatElement T>
  CommHandle reduce_scatter_async(std::type_identity_t<std::span<const T>> in, std::span<T> out,
                                  ReduceOp op = ReduceOp::Sum) {
    issued();
    return inner_->reduce_scatter_async<T>(in, out, op);
  }
  template <FloatElement T>
  void reduce(std::span<T> b, int root, ReduceOp op = ReduceOp::Sum) {
    issued();
    inner_->reduce(b, root, op);
  }
  template <FloatElement T>
  CommHandle reduce_async(std::span<T> b, int root, ReduceOp op = ReduceOp::Sum) {
    issued();
    return inner_->reduce_async(b, root, op);
  }
  template <FloatElement T>
  void all_gather(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    inner_->all_gather<T>(in, out);
  }
  template <FloatElement T>
  CommHandle all_gather_async(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    return inner_->all_gather_async<T>(in, out);
  }
  template <FloatElement T>
  void broadcast(std::span<T> b, int root) {
    inner_->broadcast(b, root);
  }
  template <FloatElement T>
  CommHandle broadcast_async(std::span<T> b, int root) {
    return inner_->broadcast_async(b, root);
  }
  void barrier() { inner_->barrier(); }
  CommHandle barrier_async() { return inner_->barrier_async(); }
  CommStats& stats() { return inner_->stats(); }
  const CommStats& stats() const { return inner_->stats(); }
  WatchedCommunicator split(int color, int key) {
    auto sub = std::make_shared<ThreadCommunicator>(inner_->split(color, key));
    WatchedCommunicator w(*sub);
    w.owned_ = std::move(sub);
    w.on_reduce = on_reduce;
    return w;
  }
  void set_timeout(std::chrono::milliseconds t) { inner_->set_timeout(t); }
  std::chrono::milliseconds timeout() const { return inner_->timeout(); }

 private:
  void issued() {
    if (on_reduce) on_reduce();
  }
  ThreadCommunicator* inner_;
  std::shared_ptr<ThreadCommunicator> owned_;
};
static_assert(Communicator<WatchedCommunicator>);

/// For each reduction a rank issued in one backward (the second step's): how many of the
/// model's parameters had their gradient then.
template <class S>
std::vector<std::size_t> parameters_with_gradients_at_each_reduction(int world, const StrategyConfig& config,
                                                                     std::size_t& parameters) {
  std::vector<std::vector<std::size_t>> seen(static_cast<std::size_t>(world));
  std::vector<std::size_t> counts(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& thread_comm) {
    WatchedCommunicator comm(thread_comm);
    Gpt<float> model(tiny_gpt());
    Engine<S, Gpt<float>, WatchedCommunicator, Sgd<float>> engine(model, comm, momentum_sgd(), config, 42);
    std::vector<const Parameter<float>*> params;
    for (const auto& unit : engine.units().units)
      for (const auto& e : unit.entries)
        if (e.numel() > 0) params.push_back(e.parameter);
    counts[static_cast<std::size_t>(comm.rank())] = params.size();
    BatchSampler sampler(tiny_data(), 8, 6, 7);
    for (int step = 0; step < 2; ++step) {
      auto& mine = seen[static_cast<std::size_t>(comm.rank())];
      mine.clear();
      comm.on_reduce = [&] {
        std::size_t with = 0;
        for (const auto* p : params) with += p->leaf().node()->has_grad ? 1 : 0;
        mine.push_back(with);
      };
      const Batch b = sampler.batch(step, comm.rank(), world);
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      engine.backward(loss, 1.0 / world);
      comm.on_reduce = nullptr;
      engine.step(0.1);
    }
  });
  parameters = counts[0];
  return seen[0];
}
}  // namespace

TEST_CASE("buckets are reduced while backward runs, in the order backward finishes them", "[engine]") {
  std::size_t parameters = 0;
  // DDP, one unit: with overlap, the first bucket goes when only the head's parameters have
  // their gradients, and every parameter is one bucket, one all-reduce.
  const auto overlapped = parameters_with_gradients_at_each_reduction<DDP>(2, buckets(one_element, true), parameters);
  REQUIRE(parameters > 10);
  REQUIRE(overlapped.size() == parameters);
  CHECK(overlapped.front() < parameters / 4);
  CHECK(std::is_sorted(overlapped.begin(), overlapped.end()));
  CHECK(overlapped.back() == parameters);
  // reduce_bucket_size (DeepSpeed's) cuts the same buckets.
  StrategyConfig by_elements;
  by_elements.reduce_bucket_size = 1;
  CHECK(parameters_with_gradients_at_each_reduction<DDP>(2, by_elements, parameters) == overlapped);
  // So does FairScale's reduce_buffer_size = 0, no batching; its 2^23 holds the tiny model whole.
  StrategyConfig unbatched;
  unbatched.reduce_buffer_size = 0;
  CHECK(parameters_with_gradients_at_each_reduction<DDP>(2, unbatched, parameters) == overlapped);
  unbatched.reduce_buffer_size = fairscale_reduce_buffer_size;
  CHECK(parameters_with_gradients_at_each_reduction<DDP>(2, unbatched, parameters).size() == 1);
  // Without overlap every bucket waits for the end of the unit's backward.
  const auto at_end = parameters_with_gradients_at_each_reduction<DDP>(2, buckets(one_element, false), parameters);
  CHECK(at_end == std::vector<std::size_t>(parameters, parameters));
  // The default buckets (25 MB) hold the whole tiny model: one all-reduce, once backward is done.
  CHECK(parameters_with_gradients_at_each_reduction<DDP>(2, {}, parameters) == std::vector<std::size_t>{parameters});
  // ZeRO-2 reduces each bucket to the ranks owning it, also while backward runs.
  const auto zero2 = parameters_with_gradients_at_each_reduction<ZeRO<2>>(2, buckets(one_element, true), parameters);
  REQUIRE(zero2.size() >= parameters);
  CHECK(zero2.front() < parameters / 4);
}
