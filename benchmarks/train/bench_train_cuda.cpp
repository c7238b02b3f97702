// GPT-2 small training on one GPU through polyshard's own layers: Gpt<bfloat16, Cuda> (bf16
// compute copy of the parameters), the tape on device tensors, and the fused AdamW kernel over
// the flat buffers with fp32 master weights and state. Tokens/s and model FLOP utilisation
// (6N + 6 L C T flops per token) against the bf16 matrix-product peak measured in the same run on
// random values, as benchmarks/gpu/pytorch_gpt2.py measures PyTorch on the same model and batch.
// --engine trains the same model through the engine instead (DDP, bf16 compute, fp32 masters,
// NCCL with one rank): what polyshard-train --device cuda runs, with its unit buffers, casts,
// reductions and step checks.
// --checkpoint recomputes each block in backward; --cpu-checkpointing also keeps each block's input
// in host memory between forward and backward (DeepSpeed's cpu_checkpointing: the device memory it
// saves, and the step time its copies cost).
// Usage: bench_train_cuda [--engine] [--checkpoint] [--cpu-checkpointing] [--batch B] [--seq T] [--layers L]
//                         [--width C] [--heads H] [--medium] [--vocab V] [--steps S] [--quick] [--json FILE]
// (--medium: GPT-2 medium, 24 layers 1024 wide with 16 heads.)
// Prints the peak of the device memory pool beside the step time (what PyTorch reports as
// torch.cuda.max_memory_allocated).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "polyshard/core/cuda/device_memory_pool.hpp"
#include "polyshard/core/cuda/runtime.hpp"
#include "polyshard/core/cuda/stream.hpp"
#include "polyshard/engine/cuda/unit_kernels.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/cuda/fused_optimizers.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/transfer.hpp"
#include "support/report.hpp"
#ifdef POLYSHARD_WITH_NCCL
#include "polyshard/engine/cuda/engine.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"
#endif

using namespace polyshard;

namespace {
/// Medians over the timed steps (after three warm-up steps), and the first and last loss. ms: the
/// device's time from the step's first enqueue to its end. host_ms: the host's time to enqueue
/// the step, up to (not including) the read of its loss: near ms, the GPU waits on the host.
struct Timing {
  double ms = 0, host_ms = 0;
  float first_loss = 0, last_loss = 0;
};
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
/// one_step(step) enqueues step `step` (from 1) on the current stream and returns its loss, a
/// scalar still on the device.
template <class Step>
Timing measure(std::int64_t steps, Step&& one_step) {
  Timing t;
  std::vector<double> step_ms, host_ms;
  cuda::Event start(true), stop(true);
  for (std::int64_t step = 1; step <= steps + 3; ++step) {
    const auto host_start = std::chrono::steady_clock::now();
    start.record(cuda::current_stream());
    const auto loss = one_step(step);
    const std::chrono::duration<double, std::milli> enqueued = std::chrono::steady_clock::now() - host_start;
    stop.record(cuda::current_stream());
    const float l = float(detail::scalar_value(loss));
    stop.synchronize();
    if (step == 1) t.first_loss = l;
    t.last_loss = l;
    if (step > 3) {  // three warm-up steps
      step_ms.push_back(stop.elapsed_ms_since(start));
      host_ms.push_back(enqueued.count());
    }
  }
  t.ms = median(step_ms);
  t.host_ms = median(host_ms);
  return t;
}

/// The best bf16 TFLOP/s of a few large square products through cuda::matmul, on random values:
/// a product of zeros runs faster than one of real data (13% on an H200), and would overstate
/// the peak the model's products can reach.
double measured_bf16_peak() {
  const std::int64_t n = 8192;
  const auto random_matrix = [n](std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    auto host = Tensor<bfloat16>::empty(Shape{n, n});
    for (auto& x : host.span()) x = bfloat16(uniform(rng));
    return to_device(host);
  };
  const auto a = random_matrix(1), b = random_matrix(2);
  auto c = Tensor<bfloat16, Cuda>::empty(Shape{n, n});
  cuda::Event start(true), stop(true);
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    start.record(cuda::current_stream());
    for (int i = 0; i < 5; ++i) matmul_into(a, b, c);
    stop.record(cuda::current_stream());
    stop.synchronize();
    const double seconds = stop.elapsed_ms_since(start) * 1e-3 / 5;
    if (rep > 0) best = std::max(best, 2.0 * double(n) * n * n / seconds / 1e12);
  }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  const bench::Args args = bench::parse_args(
      argc, argv, "bench_train_cuda.json",
      {{"--engine", "", "through the engine (DDP, NCCL with one rank), as polyshard-train --device cuda"},
       {"--batch", "B", "sequences a step (default 8)"},
       {"--seq", "T", "positions a sequence (default 1024)"},
       {"--layers", "L", "blocks (default 12; 24 with --medium, 2 with --quick)"},
       {"--width", "C", "embedding width (default 768; 1024 with --medium)"},
       {"--heads", "H", "attention heads (default 12; 16 with --medium)"},
       {"--checkpoint", "", "recompute each block in backward (activation checkpointing)"},
       {"--cpu-checkpointing", "", "and keep each block's input in host memory until backward (implies --checkpoint)"},
       {"--medium", "", "GPT-2 medium (350M): 24 layers 1024 wide with 16 heads"},
       {"--vocab", "V", "vocabulary (default 50304)"},
       {"--steps", "S", "timed steps (default 20; 6 with --quick)"}});
  // --medium and --quick set the shape and the length; the numbers given override them.
  const bool medium = args.has("--medium");
  const std::int64_t batch = args.number("--batch", 8), seq = args.number("--seq", 1024),
                     layers = args.number("--layers", args.quick ? 2 : medium ? 24 : 12),
                     width = args.number("--width", medium ? 1024 : 768),
                     heads = args.number("--heads", medium ? 16 : 12), vocab = args.number("--vocab", 50304),
                     steps = args.number("--steps", args.quick ? 6 : 20);
  const bool through_engine = args.has("--engine");
  const bool cpu_checkpointing = args.has("--cpu-checkpointing");
  const bool checkpoint_blocks = cpu_checkpointing || args.has("--checkpoint");
  const std::string json = args.json;
  const auto devices = cuda::available_devices();
  if (!devices) {
    std::printf("no CUDA device: %s (bench_train_cuda did not run)\n", devices.reason.c_str());
    return 0;
  }
#ifndef POLYSHARD_WITH_NCCL
  if (through_engine) {
    std::printf("bench_train_cuda --engine needs NCCL, which this build did not find\n");
    return 1;
  }
#endif
  const GptConfig config{.vocab_size = vocab, .block_size = seq, .n_layer = layers, .n_head = heads, .n_embd = width};
  const AdamWConfig adamw{.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

  std::mt19937 rng(1);
  auto host_ids = Tensor<std::int32_t>::empty(Shape{batch, seq + 1});
  for (auto& x : host_ids.span()) x = static_cast<std::int32_t>(rng() % 50257);
  // Inputs are tokens [0, T), targets [1, T]: the host slices them once.
  auto host_x = Tensor<std::int32_t>::empty(Shape{batch, seq}), host_y = Tensor<std::int32_t>::empty(Shape{batch, seq});
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq; ++t) {
      host_x.at(b, t) = host_ids.at(b, t);
      host_y.at(b, t) = host_ids.at(b, t + 1);
    }
  const auto x = to_device(host_x), y = to_device(host_y);

  Timing timing;
  double params = 0;
  Gpt<bfloat16, Cuda> model(config);  // bf16 compute copy of every parameter
  model.checkpoint_blocks = checkpoint_blocks;
  if (!through_engine) {
    FlatParameters<bfloat16, Cuda> flat(model);  // one buffer of values, one of gradients
    flat.initialize(/*seed=*/0);
    const auto n = static_cast<std::size_t>(flat.padded_numel());
    auto master = Tensor<float, Cuda>::empty(Shape{flat.padded_numel()}, MemoryCategory::OptimizerState);
    auto exp_avg = Tensor<float, Cuda>::zeros(Shape{flat.padded_numel()}, MemoryCategory::OptimizerState);
    auto exp_avg_sq = Tensor<float, Cuda>::zeros(Shape{flat.padded_numel()}, MemoryCategory::OptimizerState);
    cast_into(flat.values(), master);  // fp32 masters from the bf16 initial values
    params = double(flat.numel());
    timing = measure(steps, [&](std::int64_t step) {
      flat.zero_grad();
      Var<bfloat16, Cuda> loss;
      {
        CheckpointSettingsScope checkpointing({.cpu_checkpointing = cpu_checkpointing});
        loss = model.loss(x, y);
      }
      backward(loss);
      flat.settle_grads();
      cuda::fused_adamw_step<bfloat16, bfloat16>(master.data(), flat.grads().data(), exp_avg.data(),
                                                 exp_avg_sq.data(), flat.values().data(), n, adamw, step, 1.0f,
                                                 cuda::current_stream());
      return loss.value();
    });
  } else {
#ifdef POLYSHARD_WITH_NCCL
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
    NcclCommunicator comm(0, 1, id, 0);
    Engine<Strategy<NoShard, Bf16Mixed>, Gpt<bfloat16, Cuda>, NcclCommunicator, AdamW<float>> engine(
        model, comm, adamw, StrategyConfig{.cpu_checkpointing = cpu_checkpointing});
    params = double(engine.units().numel_total());
    timing = measure(steps, [&](std::int64_t) {
      auto loss = engine.forward([&] { return model.loss(x, y); });
      engine.backward(loss);
      const Tensor<bfloat16, Cuda> value = loss.value();
      loss = {};
      engine.step(adamw.lr);
      return value;
    });
#endif
  }
  const double ms = timing.ms;
  // The pool's high-water mark of the training steps, read before the peak measurement allocates.
  std::uint64_t peak_bytes = 0;
  cudaMemPoolGetAttribute(cuda::DeviceMemoryPool::current().get(), cudaMemPoolAttrUsedMemHigh, &peak_bytes);
  const double peak_gib = double(peak_bytes) / double(1 << 30);
  const float first_loss = timing.first_loss, last_loss = timing.last_loss;
  const double tokens_per_s = double(batch * seq) / (ms * 1e-3);
  const double flops_per_token = 6 * params + 6.0 * double(layers) * double(width) * double(seq);
  const double peak = measured_bf16_peak();
  const double mfu = tokens_per_s * flops_per_token / (peak * 1e12);

  const std::string run = std::string(through_engine ? "polyshard engine (DDP, NCCL x1)" : "polyshard") +
                          (cpu_checkpointing ? ", blocks checkpointed, inputs in host memory"
                                             : checkpoint_blocks ? ", blocks checkpointed" : "");
  std::printf("GPT-2 (%lld layers, %lld wide, %lld heads, vocab %lld), batch %lld x %lld tokens, bf16 compute, fp32 "
              "master, fused AdamW on %s\n",
              (long long)layers, (long long)width, (long long)heads, (long long)vocab, (long long)batch, (long long)seq, cuda::device_description(0).c_str());
  std::printf("| run | step ms | host enqueue ms | tokens/s | MFU | peak device memory GiB | loss first -> last |\n"
              "|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %.2f | %.2f | %.0f | %.1f%% | %.2f | %.3f -> %.3f |\n", run.c_str(), ms, timing.host_ms, tokens_per_s,
              100 * mfu, peak_gib, first_loss, last_loss);
  std::printf("measured bf16 matmul peak (random values) %.0f TFLOP/s; %.0f parameters\n", peak, params);
  std::ofstream out(json);
  out << "{\"benchmark\": \"train_cuda\", \"run\": \"" << run << "\", \"params\": " << params << ", \"batch\": " << batch << ", \"seq\": " << seq
      << ", \"layers\": " << layers << ", \"width\": " << width << ", \"heads\": " << heads << ", \"step_ms\": " << ms << ", \"host_enqueue_ms\": " << timing.host_ms << ", \"tokens_per_s\": " << tokens_per_s
      << ", \"mfu\": " << mfu << ", \"vocab\": " << vocab << ", \"peak_device_gib\": " << peak_gib << ", \"peak_tflops\": " << peak << ", \"first_loss\": " << first_loss
      << ", \"last_loss\": " << last_loss << "}\n";
  return 0;
}
