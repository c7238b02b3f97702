// How much gradient communication hides behind backward: the step time of each strategy with
// overlap_comm on, off, and with communication removed (a communicator that completes at once).
// The hidden fraction is 1 - (on - removed) / (off - removed): the share of the communication
// time a step without overlap pays that the overlapped step does not. Ranks as threads, or,
// started by a launcher (mpirun -np 4 bench_overlap), as its MPI processes. A second table times
// ShardedDDP with FairScale's reduce_buffer_size: 0 (each parameter reduced alone, as Lightning's
// ddp_sharded sets it on one machine), FairScale's 2^23 elements (the preset's), and PyTorch DDP's 25 MiB buckets.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#ifdef POLYSHARD_BENCH_MPI
#include "polyshard/comm/mpi_communicator.hpp"
#endif
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
  template <class Clock>
  void step(const Batch& b, std::int64_t batch, Clock& clock, bool record) {
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

/// This rank's three runs side by side, their steps interleaved (on, off, removed, on, ...) so
/// that the machine's drift falls on all three alike; the first round warms up. The runs with
/// communication have communicators of their own, split from `clock`.
template <class S, class Clock>
Times rank_times(Clock& clock, const GptConfig& cfg, std::int64_t batch, int steps, double bucket_cap_mb) {
  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  StrategyConfig on, off;
  on.bucket_cap_mb = off.bucket_cap_mb = bucket_cap_mb;
  off.overlap_comm = false;
  Clock comm_on = clock.split(0, clock.rank()), comm_off = clock.split(0, clock.rank());
  bench::InstantCommunicator none(clock.rank(), clock.size());
  Run<S, Clock> with_overlap(cfg, comm_on, on), without(cfg, comm_off, off);
  Run<S, bench::InstantCommunicator> removed(cfg, none, on);
  const BatchSampler sampler(data, cfg.block_size, batch, 3);
  for (int step = 0; step <= steps; ++step) {
    const Batch b = sampler.batch(step, clock.rank(), clock.size());
    with_overlap.step(b, batch, clock, step > 0);
    without.step(b, batch, clock, step > 0);
    removed.step(b, batch, clock, step > 0);
  }
  return {with_overlap.median(), without.median(), removed.median()};
}

/// FairScale's reduce_buffer_size under ShardedDDP: each setting's median step time
/// with overlap_comm on, the runs' steps interleaved as in rank_times, and its buckets a step.
struct BufferSetting {
  const char* name;
  StrategyConfig config;
};
struct BufferTimes {
  std::vector<double> step;
  std::vector<std::size_t> buckets;
};

/// The gradient buckets of one backward of `engine`, over all its units.
template <class E>
std::size_t buckets_per_step(const E& engine) {
  std::size_t n = 0;
  for (std::size_t unit = 0; unit < engine.units().units.size(); ++unit) n += engine.gradient_buckets(unit).size();
  return n;
}

template <class Clock>
BufferTimes buffer_times(Clock& clock, const GptConfig& cfg, std::int64_t batch, int steps,
                         const std::vector<BufferSetting>& settings) {
  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  std::deque<Clock> comms;
  std::deque<Run<ShardedDDP, Clock>> runs;  // engines bind their models: never moved
  for (const BufferSetting& s : settings)
    runs.emplace_back(cfg, comms.emplace_back(clock.split(0, clock.rank())), s.config);
  const BatchSampler sampler(data, cfg.block_size, batch, 3);
  for (int step = 0; step <= steps; ++step) {
    const Batch b = sampler.batch(step, clock.rank(), clock.size());
    for (auto& run : runs) run.step(b, batch, clock, step > 0);
  }
  BufferTimes out;
  for (auto& run : runs) {
    out.step.push_back(run.median());
    out.buckets.push_back(buckets_per_step(run.engine));
  }
  return out;
}

/// The settings buffer_times compares: Lightning's ddp_sharded on one machine (0: every
/// parameter reduced alone), FairScale's default (the preset's), and PyTorch DDP's buckets.
std::vector<BufferSetting> buffer_settings() {
  StrategyConfig alone, torch;
  alone.reduce_buffer_size = 0;
  torch.bucket_cap_mb = torch_bucket_cap_mb;
  return {{"0 (ddp_sharded on one machine)", alone},
          {"8388608 (FairScale's default)", StrategyConfig{}},
          {"none (bucket_cap_mb 25)", torch}};
}

void buffer_rows(bench::Table& table, int world, const BufferTimes& t) {
  const auto settings = buffer_settings();
  for (std::size_t i = 0; i < settings.size(); ++i)
    table.row()
        .set("reduce_buffer_size", settings[i].name)
        .set("world", double(world), 0)
        .set("buckets a step", double(t.buckets[i]), 0)
        .set("step ms", t.step[i] * 1e3)
        .set("/ FairScale's", t.step[i] / t.step[1], 3);
}

/// rank_times on `world` thread ranks: rank 0's.
template <class S>
Times measure(int world, const GptConfig& cfg, std::int64_t batch, int steps, double bucket_cap_mb) {
  Times out;
  std::mutex mutex;
  run_ranks(world, [&](ThreadCommunicator& clock) {
    const Times t = rank_times<S>(clock, cfg, batch, steps, bucket_cap_mb);
    if (clock.rank() != 0) return;
    std::lock_guard lock(mutex);
    out = t;
  });
  return out;
}

void row(bench::Table& table, const char* name, int world, const Times& t) {
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

/// Calls f.template operator()<S>(name) for each strategy measured.
template <class F>
void for_each_strategy(F&& f) {
  f.template operator()<Strategy<NoShard>>("ddp");
  f.template operator()<ZeRO<1>>("zero1");
  f.template operator()<ZeRO<2>>("zero2");
  f.template operator()<ZeRO<3>>("zero3");
  f.template operator()<Strategy<ShardParameters<true>, WrapByType<Block>>>("fsdp per block");
}

/// Prints the table and writes it as JSON to `json`.
void report(const bench::Table& table, const std::string& json) {
  table.print();
  table.write_json(json);
  std::printf("\nJSON: %s\n", json.c_str());
}

}  // namespace

int main(int argc, char** argv) {
#ifdef POLYSHARD_BENCH_MPI
  // Only when a launcher started us: a plain run measures ranks as threads.
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  std::optional<MpiSession> session;
  if (launched) session.emplace(&argc, &argv);
#endif
  const auto args = bench::parse_args(argc, argv, "bench_overlap.json");
  const GptConfig cfg{.vocab_size = 256, .block_size = 64, .n_layer = 6, .n_head = 4, .n_embd = 256};
  const int steps = args.quick ? 3 : 11;
  const double bucket_cap_mb = 2;  // a few buckets a unit: the model is 19 MiB in fp32
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const std::string setting =
      "overlapped gradient reduction on GPT L6 C256 T64, 4 rows a rank, AdamW, bucket_cap_mb 2, ";
  // The second table: FairScale's reduce_buffer_size under ShardedDDP, overlap on, in a file of its own.
  const std::string buffer_setting = "reduce_buffer_size under ShardedDDP on GPT L6 C256 T64, 4 rows a "
                                     "rank, AdamW, overlap_comm on, ";
  const std::string buffers_json = args.json.substr(0, args.json.rfind(".json")) + "_buffers.json";
#ifdef POLYSHARD_BENCH_MPI
  if (session) {
    MpiCommunicator world = MpiCommunicator::world();
    bench::Table table(setting + "ranks as MPI processes, " + std::to_string(cores) + " cores per host");
    cpu::set_blas_threads(1);
    set_optimizer_threads(1);
    for_each_strategy([&]<class S>(const char* name) {
      const Times t = rank_times<S>(world, cfg, 4 * world.size(), steps, bucket_cap_mb);
      if (world.rank() == 0) row(table, name, world.size(), t);
    });
    if (world.rank() == 0) report(table, args.json);
    bench::Table buffers(buffer_setting + "ranks as MPI processes");
    const BufferTimes t = buffer_times(world, cfg, 4 * world.size(), steps, buffer_settings());
    if (world.rank() == 0) {
      buffer_rows(buffers, world.size(), t);
      report(buffers, buffers_json);
    }
    return 0;
  }
#endif
  // The machine's peak, measured in the same run (machines of one kind differ): the tables' context.
  std::printf("fp32 FMA peak (%s), %d threads: %.1f GFLOP/s\n\n", bench::fma_peak_instructions(), cores,
              bench::measure_fma_peak_gflops(cores));
  bench::Table table(setting + "ranks as threads on " + std::to_string(cores) + " cores");
  for (const int ranks : {2, 3, 4}) {
    // A core a rank is left to its communication thread, whose copies and sums are what
    // overlap hides: where backward's BLAS threads take every core, hiding them frees none.
    cpu::set_blas_threads(std::max(1, (cores - ranks) / ranks));
    set_optimizer_threads(1);
    for_each_strategy([&]<class S>(const char* name) {
      row(table, name, ranks, measure<S>(ranks, cfg, 4 * ranks, steps, bucket_cap_mb));
    });
  }
  report(table, args.json);

  bench::Table buffers(buffer_setting + "ranks as threads on " + std::to_string(cores) + " cores");
  for (const int ranks : {2, 3}) {
    cpu::set_blas_threads(std::max(1, (cores - ranks) / ranks));
    BufferTimes t;
    std::mutex mutex;
    run_ranks(ranks, [&](ThreadCommunicator& clock) {
      BufferTimes mine = buffer_times(clock, cfg, 4 * ranks, steps, buffer_settings());
      if (clock.rank() != 0) return;
      std::lock_guard lock(mutex);
      t = std::move(mine);
    });
    buffer_rows(buffers, ranks, t);
  }
  report(buffers, buffers_json);
  return 0;
}
