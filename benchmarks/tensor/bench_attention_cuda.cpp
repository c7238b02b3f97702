// Causal attention of one layer on a GPU, forward and backward, in bf16: the fused kernels
// (tensor/cuda/flash_attention.hpp) against the materialized path (cuBLASLt products around the
// causal softmax, (B, H, T, T) probabilities), at GPT-2's B = 8, H = 12, T = 1024 with head
// dimensions 64 and 128. Times are medians of event-timed samples; TFLOP/s count the causal half
// of the products (forward 2 B H T^2 D, backward 2.5 times that). PyTorch's
// scaled_dot_product_attention on the same shapes: benchmarks/gpu/pytorch_attention.py.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "polyshard/core/cuda/runtime.hpp"
#include "polyshard/core/cuda/stream.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/transfer.hpp"
#include "support/cuda_timing.hpp"
#include "support/report.hpp"

namespace {

using polyshard::bfloat16;
using polyshard::Cuda;
using polyshard::Tensor;

double median_ms(const std::function<void()>& f, int repeats) {
  for (int i = 0; i < 2; ++i) f();
  std::vector<double> v;
  for (int r = 0; r < repeats; ++r) v.push_back(bench::sample_ms(f, 5, polyshard::cuda::current_stream()));
  return bench::median(v);
}

Tensor<bfloat16, Cuda> random_device(const polyshard::Shape& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<bfloat16> v(static_cast<std::size_t>(shape.numel()));
  for (auto& x : v) x = bfloat16(u(rng));
  return polyshard::to_device(Tensor<bfloat16>::from(shape, std::span<const bfloat16>(v)));
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = bench::parse_args(argc, argv, "bench_attention_cuda.json");
  const auto devices = polyshard::cuda::available_devices();
  if (!devices) {
    std::printf("no CUDA device: %s\n", devices.reason.c_str());
    return 0;
  }
  try {
    std::printf("device: %s\n", polyshard::cuda::device_description(0).c_str());
    const int repeats = args.quick ? 5 : 15;
    bench::Table table("causal attention of one layer, bf16, B = 8, T = 1024: fused kernels against the materialized path");
    for (const int d : {64, 128}) {
      const std::int64_t b = 8, t = 1024, h = 12, c = h * d;
      const auto qkv = random_device({b, t, 3 * c}, 1), dout = random_device({b, t, c}, 2);
      auto out = Tensor<bfloat16, Cuda>::empty({b, t, c}), dqkv = Tensor<bfloat16, Cuda>::empty({b, t, 3 * c});
      auto lse = Tensor<float, Cuda>::empty({b, h, t});
      auto att = Tensor<bfloat16, Cuda>::empty({b, h, t, t});
      const double fwd_flops = 2.0 * double(b * h) * double(t) * double(t) * double(d);
      struct Path {
        const char* name;
        std::function<void()> forward, backward;
        double saved_mib;
      };
      const std::vector<Path> paths = {
          {"fused",
           [&] { polyshard::causal_self_attention_fused_forward(qkv, int(h), out, lse); },
           [&] {
             polyshard::causal_self_attention_fused_backward(qkv, out, lse, dout, int(h),
                                                             polyshard::GradOut<bfloat16, Cuda>{dqkv});
           },
           double(b * h * t) * 4 / (1 << 20)},
          {"materialized",
           [&] { polyshard::causal_self_attention_forward(qkv, int(h), out, att); },
           [&] {
             polyshard::causal_self_attention_backward(qkv, att, dout, int(h), polyshard::GradOut<bfloat16, Cuda>{dqkv});
           },
           double(b * h * t * t) * 2 / (1 << 20)},
      };
      for (const Path& p : paths) {
        p.forward();  // the backward reads what the forward saved
        const double f = median_ms(p.forward, repeats), bw = median_ms(p.backward, repeats);
        const double both = median_ms([&] { p.forward(); p.backward(); }, repeats);
        table.row()
            .set("head dim", double(d), 0)
            .set("heads", double(h), 0)
            .set("path", p.name)
            .set("forward ms", f, 3)
            .set("backward ms", bw, 3)
            .set("forward+backward ms", both, 3)
            .set("forward TFLOP/s", fwd_flops / (f * 1e-3) / 1e12)
            .set("backward TFLOP/s", 2.5 * fwd_flops / (bw * 1e-3) / 1e12)
            .set("saved for backward MiB", p.saved_mib);
      }
    }
    table.print();
    table.write_json(args.json);
  } catch (const std::exception& e) {
    std::printf("failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
