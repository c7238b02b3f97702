// The optimizer step of a host engine at GPT-2 small's size (124M parameters, one unit per
// block, one rank), the part of ZeRO-Offload's step that runs on the CPU: the overflow check,
// the gradient norm and clipping, AdamW and the compute copy. Timed alone (engine.step after a
// forward and backward of a short batch), against the memory traffic it must move at least,
// measured in bytes per parameter and set beside the best bandwidth measured in the same run
// (a copy, or a step itself).
//
// Usage: bench_host_step [--quick] [--json FILE] [--layers L]
#include <chrono>
#include <cstring>
#include <thread>

#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/data/data.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "polyshard/policy/policy.hpp"
#include "support/report.hpp"

using namespace polyshard;

namespace {

using Clock = std::chrono::steady_clock;

// Best-of-5 copy bandwidth over 512 MiB (read + write counted): the machine's reference.
double copy_bandwidth_gbs(unsigned threads) {
  const std::size_t n = std::size_t{64} << 20;
  std::vector<double> a(n, 1.0), b(n, 0.0);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::vector<std::jthread> workers;
    const std::size_t chunk = n / threads;
    for (unsigned t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        const std::size_t lo = t * chunk, hi = t + 1 == threads ? n : lo + chunk;
        std::memcpy(b.data() + lo, a.data() + lo, (hi - lo) * sizeof(double));
      });
    workers.clear();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * double(n) * sizeof(double) / best / 1e9;
}

template <class S>
double step_seconds(const GptConfig& cfg, int steps, double max_grad_norm, std::int64_t& parameters) {
  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  double seconds = 0;
  run_ranks(1, [&](ThreadCommunicator& comm) {
    Gpt<float> model(cfg);
    Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{}, StrategyConfig{}, 1);
    parameters = engine.units().padded_total();
    const BatchSampler sampler(data, 8, 1, 3);  // (1, 8) tokens: forward and backward stay short
    std::vector<double> times;
    for (int step = 0; step < steps + 1; ++step) {
      const Batch b = sampler.batch(step);
      engine.backward(engine.forward([&] { return model.loss(b.inputs, b.targets); }));
      const auto t0 = Clock::now();
      engine.step(1e-4, max_grad_norm);
      if (step > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());  // step 0: first touches
    }
    std::sort(times.begin(), times.end());
    seconds = times[times.size() / 2];
  });
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  auto args = bench::parse_args(argc, argv, "bench_host_step.json",
                                {{"--layers", "L", "GPT-2 small's blocks to step (default 12; 2 with --quick)"}});
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  cpu::set_blas_threads(static_cast<int>(cores));
  GptConfig cfg{.vocab_size = 50257, .block_size = 64, .n_layer = 12, .n_head = 12, .n_embd = 768};
  cfg.n_layer = std::max<std::int64_t>(1, args.number("--layers", args.quick ? 2 : 12));
  const int steps = args.quick ? 2 : 7;
  const double bandwidth = copy_bandwidth_gbs(cores);
  std::printf("copy bandwidth, %u threads: %.1f GB/s\n", cores, bandwidth);

  using PerBlock = WrapByType<Block>;
  bench::Table table("The host step of GPT-2 small's shape (" + std::to_string(cfg.n_layer) +
                     " layers), AdamW, one rank, clipping at 1.0: medians of " + std::to_string(steps) + " steps");
  // Bytes a step moves at least, per parameter: AdamW reads the fp32 master and moments and the
  // gradient, writes the three back and the compute copy (when it is a buffer of its own); the
  // norm reads the gradient once more. fp32: 32 B; bf16 mixed (bf16 gradients): 30 B.
  struct Row {
    const char* precision;
    unsigned threads;
    CpuIsa isa;
    std::int64_t parameters;
    double seconds, gbs;
  };
  std::vector<Row> rows;
  const auto add = [&](const char* name, auto strategy, unsigned threads, CpuIsa isa) {
    using S = decltype(strategy);
    using CT = typename S::compute_type;
    using RT = typename S::reduce_type;
    using MT = typename S::master_type;
    const double bytes_per_parameter = 6.0 * sizeof(MT) + 2.0 * sizeof(RT) + (std::is_same_v<CT, MT> ? 0 : sizeof(CT));
    set_optimizer_threads(threads);
    set_optimizer_isa(isa);
    std::int64_t parameters = 0;
    const double s = step_seconds<S>(cfg, steps, 1.0, parameters);
    const double gbs = bytes_per_parameter * double(parameters) / s / 1e9;
    rows.push_back({name, threads, isa, parameters, s, gbs});
  };
  for (unsigned threads : {1u, cores}) {
    for (CpuIsa isa : {CpuIsa::Portable, detected_cpu_isa()}) {
      add("fp32", Strategy<NoShard, PerBlock>{}, threads, isa);
      add("bf16 mixed", Strategy<NoShard, Bf16Mixed, PerBlock>{}, threads, isa);
      if (isa == detected_cpu_isa()) break;
    }
    if (cores == 1) break;
  }
  set_optimizer_threads(0);
  // The reference: the best bandwidth measured in this run, by the copy or by a step itself (a
  // step that moves its least traffic faster than memcpy shows the copy's figure is no ceiling).
  double reference = bandwidth;
  for (const Row& r : rows) reference = std::max(reference, r.gbs);
  for (const Row& r : rows)
    table.row()
        .set("precision", r.precision)
        .set("threads", double(r.threads), 0)
        .set("isa", cpu_isa_name(r.isa))
        .set("parameters", double(r.parameters), 0)
        .set("step ms", r.seconds * 1e3)
        .set("GB/s at the least traffic", r.gbs, 1)
        .set("% of best bandwidth", 100.0 * r.gbs / reference, 1);
  std::printf("best bandwidth measured: %.1f GB/s (copy: %.1f)\n", reference, bandwidth);
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
