// The fused AdamW kernel on the GPU against the device's copy bandwidth, measured in the same run.
//
// AdamW on GPT-2 small's 124M parameters as a mixed-precision strategy runs it: fp32 master
// weights and moments, bf16 gradients, and the bf16 compute copy written in the same pass. Per
// element it must read master, grad, exp_avg, exp_avg_sq (4 + 2 + 4 + 4 bytes) and write master,
// exp_avg, exp_avg_sq and the copy (4 + 4 + 4 + 2): 28 bytes. The reference is a device-to-device
// cudaMemcpyAsync of a large buffer, counting its read and its write. Both are timed with CUDA
// events, median of the repetitions after a warm-up. Target: AdamW at >= 85% of copy bandwidth.
//
// Usage: bench_adamw_cuda [--n ELEMENTS] [--reps R] [--quick] [--json FILE]
//        (without a CUDA device it says so and exits 0)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "polyshard/core/cuda/device_buffer.hpp"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/cuda/runtime.hpp"
#include "polyshard/core/cuda/stream.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/optim/cuda/fused_optimizers.hpp"
#include "support/report.hpp"

namespace {

namespace cuda = polyshard::cuda;
using polyshard::bfloat16;
using polyshard::MemoryCategory;

// Median milliseconds of `reps` timed calls of `body` in `stream`, after `warmup` untimed ones;
// each call is bracketed by its own pair of events.
double median_ms(cudaStream_t stream, int reps, int warmup, const std::function<void()>& body) {
  for (int i = 0; i < warmup; ++i) body();
  POLYSHARD_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  cuda::Event start(true), stop(true);
  for (int i = 0; i < reps; ++i) {
    start.record(stream);
    body();
    stop.record(stream);
    stop.synchronize();
    ms.push_back(stop.elapsed_ms_since(start));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args =
      bench::parse_args(argc, argv, "bench_adamw_cuda.json",
                        {{"--n", "ELEMENTS", "parameters stepped (default: GPT-2 small's 124,439,808)"},
                         {"--reps", "R", "timed steps (default 20; 5 with --quick)"}});
  // GPT-2 small (124M), tied embeddings counted once.
  const auto n = static_cast<std::size_t>(std::max(1LL, args.number("--n", 124'439'808)));
  const int reps = static_cast<int>(std::max(1LL, args.number("--reps", args.quick ? 5 : 20)));
  if (const auto devices = cuda::available_devices(); !devices) {
    std::printf("no CUDA device: %s (bench_adamw_cuda did not run)\n", devices.reason.c_str());
    return 0;
  }
  const std::string device = cuda::device_description(0);
  cuda::Stream stream;

  // Copy bandwidth: 1 GiB copied device to device, 2 GiB moved per copy.
  const std::size_t copy_bytes = std::size_t{1} << 30;
  cuda::DeviceBuffer<unsigned char> copy_src(copy_bytes, MemoryCategory::Other, stream);
  cuda::DeviceBuffer<unsigned char> copy_dst(copy_bytes, MemoryCategory::Other, stream);
  copy_src.fill_bytes(0x3C);
  const double copy_ms = median_ms(stream, reps, 3, [&] {
    POLYSHARD_CUDA_CHECK(cudaMemcpyAsync(copy_dst.data(), copy_src.data(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e-3) / 1e9;
  copy_src.reset();
  copy_dst.reset();

  // AdamW state of n parameters (2 GiB at 124M). Byte patterns give finite values: 0x3C3C3C3C is
  // about 0.0115 as a float, 0x3C3C about 0.0115 as a bf16; the moments start at zero.
  cuda::DeviceBuffer<float> master(n, MemoryCategory::Parameters, stream);
  cuda::DeviceBuffer<float> exp_avg(n, MemoryCategory::OptimizerState, stream);
  cuda::DeviceBuffer<float> exp_avg_sq(n, MemoryCategory::OptimizerState, stream);
  cuda::DeviceBuffer<bfloat16> grad(n, MemoryCategory::Gradients, stream);
  cuda::DeviceBuffer<bfloat16> compute(n, MemoryCategory::Parameters, stream);
  master.fill_bytes(0x3C);
  grad.fill_bytes(0x3C);
  exp_avg.fill_bytes(0);
  exp_avg_sq.fill_bytes(0);
  const polyshard::AdamWConfig config{.lr = 3e-4, .weight_decay = 0.1};
  std::int64_t step = 0;
  const double adamw_ms = median_ms(stream, reps, 3, [&] {
    cuda::fused_adamw_step<bfloat16, bfloat16>(master.data(), grad.data(), exp_avg.data(), exp_avg_sq.data(),
                                               compute.data(), n, config, ++step, 1.0f / 1024, stream);
  });
  const double bytes_per_element = 28;
  const double adamw_gbs = bytes_per_element * static_cast<double>(n) / (adamw_ms * 1e-3) / 1e9;
  const double percent = 100 * adamw_gbs / copy_gbs;

  bench::Table table("adamw_cuda");
  table.row()
      .set("kernel", "device copy (cudaMemcpyAsync D2D)")
      .set("bytes", 2.0 * static_cast<double>(copy_bytes), 0)
      .set("median_ms", copy_ms, 3)
      .set("GB/s", copy_gbs)
      .set("% of copy", 100.0)
      .set("device", device);
  table.row()
      .set("kernel", "fused AdamW (fp32 master+state, bf16 grad+copy)")
      .set("bytes", bytes_per_element * static_cast<double>(n), 0)
      .set("median_ms", adamw_ms, 3)
      .set("GB/s", adamw_gbs)
      .set("% of copy", percent)
      .set("device", device);
  std::printf("fused AdamW over %zu parameters, %.0f bytes each, median of %d runs after warm-up", n, bytes_per_element,
              reps);
  table.print();
  std::printf("\nfused AdamW reaches %.1f%% of the device copy bandwidth (target >= 85%%): %s\n", percent,
              percent >= 85 ? "met" : "NOT met");
  if (!args.json.empty()) {
    table.write_json(args.json);
    std::printf("wrote %s\n", args.json.c_str());
  }
  return 0;
}
