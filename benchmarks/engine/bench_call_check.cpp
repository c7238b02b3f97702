// The cost of comparing every collective across ranks (CommOptions::check_calls, on by default
// under MPI): the step time of the GPT under three strategies with the check on and off, on the
// MPI processes this runs on (mpirun -np 4 bench_call_check), and the collectives per step; and
// the check alone, on an all-reduce of one float ("step ms" is then the call's time).
#include <mpi.h>

#include <thread>

#include "polyshard/comm/mpi_communicator.hpp"
#include "polyshard/data/data.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "polyshard/policy/policy.hpp"
#include "support/report.hpp"

using namespace polyshard;

namespace {

struct Figures {
  double on_s = 0, off_s = 0, calls = 0;
};

/// Median step time with the check on and off, the two interleaved step by step so that
/// whatever else slows the machine slows both alike.
template <class S>
Figures measure(MpiCommunicator& comm, const GptConfig& cfg, std::int64_t batch, int steps) {
  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  Gpt<float> model(cfg);
  Engine<S, Gpt<float>, MpiCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{}, {}, 1);
  const BatchSampler sampler(data, cfg.block_size, batch, 3);
  std::vector<double> on, off;
  Figures out;
  for (int step = 0; step < 2 * steps + 2; ++step) {
    const bool check = step % 2 == 0;
    comm.set_check_calls(check);
    comm.barrier();  // start each step together, so the time is the step's, not a straggler's
    comm.stats().reset();
    const auto t0 = std::chrono::steady_clock::now();
    const Batch b = sampler.batch(step, comm.rank(), comm.size());
    const double weight = double(b.inputs.size(0)) / double(batch);
    engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }), weight);
    engine.step(1e-3);
    comm.barrier();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step < 2) continue;  // warm-up, once each way
    (check ? on : off).push_back(t);
    double calls = -1;  // without the closing barrier
    for (std::size_t k = 0; k < collective_kind_count; ++k) calls += double(comm.stats().calls(CollectiveKind(k)));
    out.calls = calls;
  }
  comm.set_check_calls(true);
  std::sort(on.begin(), on.end());
  std::sort(off.begin(), off.end());
  out.on_s = on[on.size() / 2];
  out.off_s = off[off.size() / 2];
  return out;
}

/// The check alone: the median time of an all-reduce of one float, checked and unchecked.
Figures measure_tiny_all_reduce(MpiCommunicator& comm, int calls) {
  Figures out;
  std::vector<double> on, off;
  float x = 1.0f;
  for (int i = 0; i < 2 * calls + 20; ++i) {
    const bool check = i % 2 == 0;
    comm.set_check_calls(check);
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    comm.all_reduce(std::span<float>(&x, 1));
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 20) (check ? on : off).push_back(t);
  }
  comm.set_check_calls(true);
  std::sort(on.begin(), on.end());
  std::sort(off.begin(), off.end());
  out.on_s = on[on.size() / 2];
  out.off_s = off[off.size() / 2];
  out.calls = 1;
  return out;
}

void add_row(bench::Table& table, const MpiCommunicator& comm, const char* name, const Figures& f) {
  table.row()
      .set("strategy", name)
      .set("processes", double(comm.size()), 0)
      .set("collectives/step", f.calls, 0)
      .set("step ms, checked", f.on_s * 1e3, 3)
      .set("step ms, unchecked", f.off_s * 1e3, 3)
      .set("cost %", 100.0 * (f.on_s - f.off_s) / f.off_s, 1)
      .set("us per collective", 1e6 * (f.on_s - f.off_s) / f.calls, 1);
}

template <class S>
void row(bench::Table& table, MpiCommunicator& comm, const char* name, const GptConfig& cfg, std::int64_t batch,
         int steps) {
  const Figures f = measure<S>(comm, cfg, batch, steps);
  if (comm.rank() == 0) add_row(table, comm, name, f);
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);
  const auto args = bench::parse_args(argc, argv, "bench_call_check.json");
  MpiCommunicator comm = MpiCommunicator::world();
  cpu::set_blas_threads(1);
  set_optimizer_threads(1);
  const GptConfig cfg{.vocab_size = 256, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128};
  const std::int64_t batch = 4L * comm.size();
  const int steps = args.quick ? 4 : 40;
  using PerBlock = WrapByType<Block>;
  bench::Table table("the cross-rank check of every collective under MPI, GPT L4 C128 T64, 4 rows a process, AdamW");
  row<Strategy<NoShard, PerBlock>>(table, comm, "ddp", cfg, batch, steps);
  row<Strategy<ShardGradients, PerBlock>>(table, comm, "zero2", cfg, batch, steps);
  row<Strategy<ShardParameters<true>, PerBlock>>(table, comm, "zero3", cfg, batch, steps);
  const Figures tiny = measure_tiny_all_reduce(comm, args.quick ? 20 : 500);
  if (comm.rank() != 0) return 0;
  add_row(table, comm, "all_reduce of 1 float", tiny);
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
