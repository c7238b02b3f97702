// How much gradient communication hides behind backward: the step time of each strategy with
// overlap_comm on, off, and with communication removed (a communicator that completes at once),
// ranks as threads. The hidden fraction is 1 - (on - removed) / (off - removed): the share of the
// communication time a step without overlap pays that the overlapped step does not.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/data/data.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "polyshard/policy/policy.hpp"
#include "support/instant_communicator.hpp"
#include "support/report.hpp"

using namespace polyshard;

namespace {

/// Median step times of rank 0 with overlap_comm on, off, and with communication removed.
struct Times {
  double on = 0, off = 0, removed = 0;
};

/// One rank's engine under S over communicator Comm, and how long each of its steps took.
template <class S, class Comm>
struct Run {
  Gpt<float> model;
  Engine<S, Gpt<float>, Comm, AdamW<float>> engine;
  std::vector<double> seconds;
  Run(const GptConfig& cfg, Comm& comm, const StrategyConfig& config)
      : model(cfg), engine(model, comm, AdamWConfig{}, config, 1) {}
  void step(const Batch& b, std::int64_t batch, ThreadCommunicator& clock, bool record) {
    clock.barrier();  // every rank starts together: the step's time, not a straggler's
    const auto t0 = std::chrono::steady_clock::now();
    engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }),
                    double(b.inputs.size(0)) / double(batch));
    engine.step(1e-3);
    clock.barrier();
    if (record) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double median() {
    std::sort(seconds.begin(), seconds.end());
    return seconds[seconds.size() / 2];
  }
};

/// The three runs side by side on every rank, their steps interleaved (on, off, removed, on,
/// ...) so that the machine's drift falls on all three alike; the first round warms up.
template <class S>
Times measure(int world, const GptConfig& cfg, std::int64_t batch, int steps, double bucket_cap_mb) {
  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  StrategyConfig on, off;
  on.bucket_cap_mb = off.bucket_cap_mb = bucket_cap_mb;
  off.overlap_comm = false;
  Times out;
  std::mutex mutex;
  run_ranks(world, [&](ThreadCommunicator& clock) {
    ThreadCommunicator comm_on = clock.split(0, clock.rank()), comm_off = clock.split(0, clock.rank());
    bench::InstantCommunicator none(clock.rank(), clock.size());
    Run<S, ThreadCommunicator> with_overlap(cfg, comm_on, on), without(cfg, comm_off, off);
    Run<S, bench::InstantCommunicator> removed(cfg, none, on);
    const BatchSampler sampler(data, cfg.block_size, batch, 3);
    for (int step = 0; step <= steps; ++step) {
      const Batch b = sampler.batch(step, clock.rank(), world);
      with_overlap.step(b, batch, clock, step > 0);
      without.step(b, batch, clock, step > 0);
      removed.step(b, batch, clock, step > 0);
    }
    if (clock.rank() != 0) return;
    std::lock_guard lock(mutex);
    out = {with_overlap.median(), without.median(), removed.median()};
  });
  return out;
}

template <class S>
void row(bench::Table& table, const char* name, int world, const GptConfig& cfg, std::int64_t batch, int steps,
         double bucket_cap_mb) {
  const Times t = measure<S>(world, cfg, batch, steps, bucket_cap_mb);
  const double paid = t.off - t.removed;
  table.row()
      .set("strategy", name)
      .set("world", double(world), 0)
      .set("overlap ms", t.on * 1e3)
      .set("no overlap ms", t.off * 1e3)
      .set("no communication ms", t.removed * 1e3)
      .set("communication ms", paid * 1e3)
      .set("hidden", paid > 0 ? 1.0 - (t.on - t.removed) / paid : 0.0, 2)
      .set("overlap / no communication", t.on / t.removed, 3);
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = bench::parse_args(argc, argv, "bench_overlap.json");
  const GptConfig cfg{.vocab_size = 256, .block_size = 64, .n_layer = 6, .n_head = 4, .n_embd = 256};
  const int steps = args.quick ? 3 : 11;
  const double bucket_cap_mb = 2;  // a few buckets a unit: the model is 19 MiB in fp32
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  bench::Table table("overlapped gradient reduction on GPT L6 C256 T64, 4 rows a rank, AdamW, bucket_cap_mb 2, "
                     "ranks as threads on " + std::to_string(cores) + " cores");
  for (const int world : {2, 3}) {
    const std::int64_t batch = 4 * world;
    cpu::set_blas_threads(std::max(1, cores / world));
    set_optimizer_threads(1);
    row<Strategy<NoShard>>(table, "ddp", world, cfg, batch, steps, bucket_cap_mb);
    row<ZeRO<1>>(table, "zero1", world, cfg, batch, steps, bucket_cap_mb);
    row<ZeRO<2>>(table, "zero2", world, cfg, batch, steps, bucket_cap_mb);
    row<ZeRO<3>>(table, "zero3", world, cfg, batch, steps, bucket_cap_mb);
    row<Strategy<ShardParameters<true>, WrapByType<Block>>>(table, "fsdp per block", world, cfg, batch, steps,
                                                            bucket_cap_mb);
  }
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
