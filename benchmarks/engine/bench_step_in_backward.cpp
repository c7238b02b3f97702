// How much of an offloaded optimizer's host step hides behind backward: the step time of a host
// engine under ZeRO-2 with the optimizer offloaded (bf16 mixed, AdamW, one unit per block, one
// rank) through backward() then step(), and through backward_and_step(), which hands each unit's
// step to a host thread as its gradients land. Both on the same engine, steps alternating, so
// that the machine's drift falls on both alike. The hidden share is
// (apart - together) / (the host step's own time, apart). With clipping, every unit's update
// waits for the global norm: only the checks and the norm's partial sums move into backward.
//
// On a CPU the host step and backward compete for the same cores and memory; on a GPU the host
// step has the CPU to itself while the device computes (the figure there is owed).
//
// Usage: bench_step_in_backward [--quick] [--json FILE]
#include <algorithm>
#include <chrono>
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
using ZeRO2Offloaded = Strategy<ShardGradients, OffloadOptimizer<Cpu>, WrapByType<Block>, Bf16Mixed>;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median times of one configuration: forward, backward and step apart, and forward then
/// backward_and_step.
struct Times {
  double forward = 0, backward = 0, step = 0, apart = 0, together = 0;
};

Times measure(const GptConfig& cfg, std::int64_t batch, int steps, double max_grad_norm) {
  const TextDataset data = TextDataset::from_text(builtin_corpus(), "builtin");
  Times out;
  run_ranks(1, [&](ThreadCommunicator& comm) {
    Gpt<float> model(cfg);
    Engine<ZeRO2Offloaded, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{},
                                                                                 StrategyConfig{}, 1);
    const BatchSampler sampler(data, cfg.block_size, batch, 3);
    std::vector<double> forward, backward, step, apart, together;
    for (int s = 0; s < 2 * (steps + 1); ++s) {
      const Batch b = sampler.batch(s);
      const bool record = s >= 2;  // the first of each kind: first touches
      const auto t0 = Clock::now();
      Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
      const double f = seconds_since(t0);
      if (s % 2 == 0) {
        const auto t1 = Clock::now();
        engine.backward(loss);
        const double bw = seconds_since(t1);
        const auto t2 = Clock::now();
        engine.step(1e-4, max_grad_norm);
        if (record) {
          forward.push_back(f);
          backward.push_back(bw);
          step.push_back(seconds_since(t2));
          apart.push_back(seconds_since(t0));
        }
      } else {
        engine.backward_and_step(loss, 1.0, 1e-4, max_grad_norm);
        if (record) together.push_back(seconds_since(t0));
      }
    }
    out = {median(forward), median(backward), median(step), median(apart), median(together)};
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  auto args = bench::parse_args(argc, argv, "bench_step_in_backward.json");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  cpu::set_blas_threads(static_cast<int>(cores));
  GptConfig cfg{.vocab_size = 50257, .block_size = 64, .n_layer = 12, .n_head = 12, .n_embd = 768};
  std::int64_t batch = 2;
  if (args.quick) {
    cfg = {.vocab_size = 512, .block_size = 32, .n_layer = 4, .n_head = 4, .n_embd = 128};
    batch = 4;
  }
  const int steps = args.quick ? 2 : 5;
  bench::Table table("An offloaded host step beside backward: ZeRO-2, optimizer on the host, bf16 mixed, AdamW, " +
                     std::to_string(cfg.n_layer) + " blocks of width " + std::to_string(cfg.n_embd) + ", " +
                     std::to_string(batch) + " x " + std::to_string(cfg.block_size) + " tokens, one rank, " +
                     std::to_string(cores) + " cores: medians of " + std::to_string(steps) + " steps");
  // Shared: backward's matrix products and the host step each on every core. Split: half the
  // cores each, as a GPU step would leave the host's cores to the host step alone.
  const unsigned half = std::max(1u, cores / 2);
  for (const bool split : {false, true}) {
    if (split && cores < 2) break;
    cpu::set_blas_threads(static_cast<int>(split ? half : cores));
    set_optimizer_threads(split ? cores - half : cores);
    for (const double clip : {std::numeric_limits<double>::infinity(), 1.0}) {
      const Times t = measure(cfg, batch, steps, clip);
      table.row()
          .set("threads (backward + step)", split ? std::to_string(half) + " + " + std::to_string(cores - half)
                                                  : "all + all")
          .set("clipping", std::isfinite(clip) ? "at 1.0" : "none")
          .set("forward ms", t.forward * 1e3)
          .set("backward ms", t.backward * 1e3)
          .set("step ms", t.step * 1e3)
          .set("apart ms", t.apart * 1e3)
          .set("together ms", t.together * 1e3)
          .set("speed-up", t.apart / t.together, 3)
          .set("% of the step hidden", 100.0 * (t.apart - t.together) / t.step, 1);
    }
  }
  set_optimizer_threads(0);
  table.print();
  table.write_json(args.json);
  std::printf("\nJSON: %s\n", args.json.c_str());
}
