// AdamW on the CPU: elements per second against the memory-bound limit of 28 bytes per element.
//
// AdamW reads param, grad, exp_avg and exp_avg_sq and writes the three it updates back: 16 bytes
// read and 12 written per fp32 element, and since every written line was read first there is no
// write-allocate traffic on top. The limit is the bandwidth measured in the same run, best of
// several runs and thread counts: both the best any kernel reaches (triad, in-place update) and
// the best of a trivial kernel with exactly AdamW's traffic. polyshard's kernel runs on every
// instruction set the machine has (portable, AVX2, AVX-512: optim/detail/cpu_isa.hpp), in fp32
// and as a mixed-precision engine steps (bf16 gradients in, the bf16 compute copy written in the
// same pass, also 28 B per element; or written by a cast pass after the update, 34 B).
//
// Usage: bench_adamw [--n ELEMENTS] [--reps R] [--aligned] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "polyshard/optim/optim.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string name;
  unsigned threads;
  double bytes_per_element;
  double seconds;  // per pass over n elements
  std::size_t n;
  double elements_per_s() const { return static_cast<double>(n) / seconds; }
  double gb_per_s() const { return elements_per_s() * bytes_per_element / 1e9; }
};

// Runs body(begin, end) over [0, n) on `threads` threads, split in contiguous parts.
void split(std::size_t n, unsigned threads, const std::function<void(std::size_t, std::size_t)>& body) {
  if (threads <= 1) {
    body(0, n);
    return;
  }
  std::vector<std::jthread> workers;
  const std::size_t chunk = (n + threads - 1) / threads / 64 * 64 + 64;
  for (unsigned t = 1; t < threads; ++t) {
    const std::size_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    workers.emplace_back([&body, b, e] { body(b, e); });
  }
  body(0, std::min(n, chunk));
}

// Times every case `reps` times, round robin, so that a disturbance from the rest of the machine
// (timings here vary 20-35% run to run) falls on all cases alike. Returns sorted times per case.
std::vector<std::vector<double>> time_round_robin(int reps, const std::vector<std::function<void()>>& cases) {
  for (const auto& pass : cases) pass();  // warm-up: first touches, thread start-up, frequency ramp
  std::vector<std::vector<double>> t(cases.size());
  for (int r = 0; r < reps; ++r) {
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const auto start = Clock::now();
      cases[c]();
      t[c].push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  for (auto& times : t) std::sort(times.begin(), times.end());
  return t;
}

// Four arrays of n floats carved from one allocation. Staggered (the default), array k starts
// k * (64 KiB + 64 B) further into the page than array 0, as an allocator that offsets its large
// buffers would place them. With --aligned they share their offset within a 4 KiB page, as four
// separate large mallocs usually do: the streams then contend for the same cache sets and DRAM
// banks, which costs AdamW's four-stream pattern (and the same-traffic kernel) 10-25% here.
struct Arrays {
  static constexpr std::size_t stagger = 16400;  // floats
  std::vector<float> storage;
  std::span<float> a, b, c, d;
  Arrays(std::size_t n, bool staggered) : storage(4 * (n + stagger)) {
    const std::size_t stride = staggered ? n + stagger : (n + 1023) / 1024 * 1024;
    a = {storage.data(), n};
    b = {storage.data() + stride, n};
    c = {storage.data() + 2 * stride, n};
    d = {storage.data() + 3 * stride, n};
  }
};

double best(const std::vector<double>& t) { return t.front(); }
double median(const std::vector<double>& t) { return t[t.size() / 2]; }

// The reference a user would write: one scalar loop with std::sqrt. Whether it vectorizes
// depends on the flags (-fno-math-errno); polyshard's kernel does not.
void naive_adamw(float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end, float lr,
                 float b1, float b2, float eps, float wd, float bc1, float bc2_sqrt) {
  for (std::size_t i = begin; i < end; ++i) {
    p[i] *= 1 - lr * wd;
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = std::size_t{32} << 20;
  int reps = 11;
  std::string json_path;
  bool staggered = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) {
      n = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--aligned") {
      staggered = false;
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--n ELEMENTS] [--reps R] [--aligned] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());

  // (n,) each: fp32 params, grads, first and second moments; 4 * 4n bytes, far beyond any cache.
  Arrays state(n, staggered);
  const std::span<float> p = state.a, g = state.b, m = state.c, v = state.d;
  split(n, hw, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      p[i] = std::sin(static_cast<float>(i % 4096));
      g[i] = 1e-2f * std::cos(static_cast<float>(i % 1000));
      m[i] = 0;
      v[i] = 0;
    }
  });

  std::vector<unsigned> thread_counts{1};
  if (hw > 1) thread_counts.push_back(hw);

  // Bandwidth: STREAM triad (12 bytes counted per element, as STREAM counts them), an in-place
  // update of one array from another (12 bytes: read both, write one back) and one with AdamW's
  // own traffic (4 streams read, 3 written back: 28 bytes). They run on buffers of their own, as
  // large as AdamW's, so the optimizer state stays what AdamW made it.
  Arrays scratch(n, staggered);
  const std::span<float> a = scratch.a, b = scratch.b, c = scratch.c, d = scratch.d;
  for (std::span<float> x : {a, b, c, d}) std::fill(x.begin(), x.end(), 0.5f);
  std::vector<std::function<void()>> cases;
  std::vector<Row> rows;  // one per case; seconds filled in below
  for (unsigned t : thread_counts) {
    cases.push_back([&, t] {
      split(n, t, [&](std::size_t lo, std::size_t hi) {
        float* __restrict out = a.data();
        const float* __restrict x = b.data();
        const float* __restrict y = c.data();
        for (std::size_t i = lo; i < hi; ++i) out[i] = x[i] + 0.5f * y[i];
      });
    });
    rows.push_back({"stream triad", t, 12, 0, n});
    cases.push_back([&, t] {
      split(n, t, [&](std::size_t lo, std::size_t hi) {
        float* __restrict y = c.data();
        const float* __restrict x = b.data();
        for (std::size_t i = lo; i < hi; ++i) y[i] = 0.5f * y[i] + x[i];
      });
    });
    rows.push_back({"in-place, 2 streams", t, 12, 0, n});
    cases.push_back([&, t] {
      split(n, t, [&](std::size_t lo, std::size_t hi) {
        float* __restrict pp = a.data();
        const float* __restrict gg = b.data();
        float* __restrict mm = c.data();
        float* __restrict vv = d.data();
        for (std::size_t i = lo; i < hi; ++i) {
          pp[i] = 0.5f * pp[i] + gg[i];
          mm[i] = 0.5f * mm[i] + gg[i];
          vv[i] = 0.5f * vv[i] + gg[i];
        }
      });
    });
    rows.push_back({"in-place, AdamW traffic", t, 28, 0, n});
  }
  const std::size_t bandwidth_cases = cases.size();

  // AdamW: polyshard's kernel on each instruction set this machine runs, and the plain loop, all
  // correct updates of the same state. Mixed precision as an engine steps it: fp32 masters and
  // state, bf16 gradients in, the bf16 compute copy out, either in the same pass (14 B read and
  // 14 B written per element) or as the update followed by a cast pass (4 + 2 B more).
  const polyshard::AdamWConfig config{};
  std::int64_t step = 0;
  std::vector<polyshard::bfloat16> g16(n), copy16(n);
  split(n, hw, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      g16[i] = static_cast<polyshard::bfloat16>(g[i]);
      copy16[i] = polyshard::bfloat16(0.0f);
    }
  });
  const std::span<const polyshard::bfloat16> grads16(g16);
  const std::span<polyshard::bfloat16> compute16(copy16);
  std::vector<polyshard::CpuIsa> isas;
  for (polyshard::CpuIsa isa : {polyshard::CpuIsa::Portable, polyshard::CpuIsa::Avx2, polyshard::CpuIsa::Avx512})
    if (isa <= polyshard::detected_cpu_isa()) isas.push_back(isa);
  for (polyshard::CpuIsa isa : isas) {
    const std::string on = std::string(" (") + polyshard::cpu_isa_name(isa) + ")";
    for (unsigned t : thread_counts) {
      cases.push_back([&, t, isa] {
        polyshard::set_optimizer_threads(t);
        polyshard::set_optimizer_isa(isa);
        polyshard::adam_update<float, float>(p, g, m, v, config, ++step, true);
      });
      rows.push_back({"adamw fp32" + on, t, 28, 0, n});
      cases.push_back([&, t, isa] {
        polyshard::set_optimizer_threads(t);
        polyshard::set_optimizer_isa(isa);
        polyshard::adam_update<polyshard::bfloat16, polyshard::bfloat16>(p, grads16, m, v, config, ++step, true,
                                                                        compute16);
      });
      rows.push_back({"mixed, one pass" + on, t, 28, 0, n});
      cases.push_back([&, t, isa] {
        polyshard::set_optimizer_threads(t);
        polyshard::set_optimizer_isa(isa);
        polyshard::adam_update<float, polyshard::bfloat16>(p, grads16, m, v, config, ++step, true);
        split(n, t, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) copy16[i] = static_cast<polyshard::bfloat16>(p[i]);
        });
      });
      rows.push_back({"mixed, then a cast pass" + on, t, 34, 0, n});
    }
  }
  for (unsigned t : thread_counts) {
    cases.push_back([&, t] {
      ++step;
      const float bc1 = 1 - std::pow(0.9f, static_cast<float>(step));
      const float bc2_sqrt = std::sqrt(1 - std::pow(0.999f, static_cast<float>(step)));
      split(n, t, [&](std::size_t b, std::size_t e) {
        naive_adamw(p.data(), g.data(), m.data(), v.data(), b, e, 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, bc1, bc2_sqrt);
      });
    });
    rows.push_back({"adamw (naive loop)", t, 28, 0, n});
  }
  const auto times = time_round_robin(reps, cases);
  polyshard::set_optimizer_threads(0);
  polyshard::set_optimizer_isa(polyshard::detected_cpu_isa());
  std::vector<Row> bandwidth, adamw;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    Row r = rows[c];
    if (c < bandwidth_cases) {
      r.seconds = best(times[c]);
      bandwidth.push_back(r);
    } else {
      r.seconds = median(times[c]);
      adamw.push_back(r);
    }
  }
  // Two references: the best any kernel moved (the machine's bandwidth), and the best of the kernels
  // with AdamW's own traffic (what its access pattern can get: more streams and a larger share of
  // writes cost DRAM efficiency, whatever the arithmetic). The AdamW kernels' own best runs count
  // too: they are kernels of known traffic, and a reference below one of them would put a median
  // above 100%.
  double peak_gbs = 0, same_traffic_gbs = 0;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    Row r = rows[c];
    r.seconds = best(times[c]);
    peak_gbs = std::max(peak_gbs, r.gb_per_s());
    if (r.bytes_per_element == 28 && r.name.rfind("mixed", 0) != 0) same_traffic_gbs = std::max(same_traffic_gbs, r.gb_per_s());
  }

  std::printf("AdamW over %zu fp32 elements (%.0f MiB of params, grads and state, arrays %s), %d runs each, "
              "round robin\n",
              n, 16.0 * static_cast<double>(n) / (1 << 20), staggered ? "staggered" : "page-aligned", reps);
  std::printf("\nmeasured bandwidth (best of %d):\n", reps);
  std::printf("  %-26s %7s %14s %9s\n", "kernel", "threads", "elements/s", "GB/s");
  for (const Row& r : bandwidth)
    std::printf("  %-26s %7u %14.3e %9.1f\n", r.name.c_str(), r.threads, r.elements_per_s(), r.gb_per_s());
  std::printf("  machine bandwidth (best kernel, AdamW's runs included): %.1f GB/s -> limit %.3e elements/s at 28 B/element\n", peak_gbs,
              peak_gbs * 1e9 / 28);
  std::printf("  AdamW's traffic pattern:         %.1f GB/s -> limit %.3e elements/s at 28 B/element\n",
              same_traffic_gbs, same_traffic_gbs * 1e9 / 28);
  std::printf("\nAdamW (median of %d):\n", reps);
  std::printf("  %-34s %7s %14s %9s %11s %15s\n", "kernel", "threads", "elements/s", "GB/s", "% of best", "% of same-traffic");
  for (const Row& r : adamw)
    std::printf("  %-34s %7u %14.3e %9.1f %10.1f%% %14.1f%%\n", r.name.c_str(), r.threads, r.elements_per_s(),
                r.gb_per_s(), 100 * r.gb_per_s() / peak_gbs, 100 * r.gb_per_s() / same_traffic_gbs);
  // The best of each polyshard kernel over instruction sets and thread counts.
  const auto best_of = [&](const std::string& prefix) {
    double gbs = 0;
    for (const Row& r : adamw)
      if (r.name.rfind(prefix, 0) == 0) gbs = std::max(gbs, r.gb_per_s());
    return gbs;
  };
  const double best_polyshard = best_of("adamw fp32");
  const double percent = 100 * best_polyshard / peak_gbs;
  const double percent_same = 100 * best_polyshard / same_traffic_gbs;
  const double percent_mixed = 100 * best_of("mixed, one pass") / peak_gbs;
  std::printf("\npolyshard AdamW at its best thread count: %.1f%% of the machine bandwidth, %.1f%% of what AdamW's "
              "traffic pattern reaches (target >= 90%%)\n",
              percent, percent_same);
  std::printf("mixed precision in one pass (bf16 gradients in, bf16 copy out): %.1f%% of the machine bandwidth "
              "(target >= 80%%); instruction sets here: %s\n",
              percent_mixed, polyshard::cpu_isa_name(polyshard::detected_cpu_isa()));

  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\n  \"benchmark\": \"adamw\",\n  \"elements\": " << n << ",\n  \"runs\": " << reps
        << ",\n  \"arrays\": \"" << (staggered ? "staggered" : "page-aligned") << "\""
        << ",\n  \"bytes_per_element\": 28,\n  \"bandwidth_gb_per_s\": " << peak_gbs
        << ",\n  \"same_traffic_gb_per_s\": " << same_traffic_gbs << ",\n  \"target_percent\": 90,\n  \"percent_of_bandwidth\": "
        << percent << ",\n  \"widest_isa\": \"" << polyshard::cpu_isa_name(polyshard::detected_cpu_isa())
        << "\",\n  \"mixed_one_pass_percent_of_bandwidth\": " << percent_mixed << ",\n  \"percent_of_same_traffic_bandwidth\": " << percent_same << ",\n  \"bandwidth\": [";
    for (std::size_t i = 0; i < bandwidth.size(); ++i) {
      const Row& r = bandwidth[i];
      out << (i ? "," : "") << "\n    {\"kernel\": \"" << r.name << "\", \"threads\": " << r.threads
          << ", \"bytes_per_element\": " << r.bytes_per_element << ", \"best_seconds\": " << r.seconds
          << ", \"gb_per_s\": " << r.gb_per_s() << "}";
    }
    out << "\n  ],\n  \"adamw\": [";
    for (std::size_t i = 0; i < adamw.size(); ++i) {
      const Row& r = adamw[i];
      out << (i ? "," : "") << "\n    {\"kernel\": \"" << r.name << "\", \"threads\": " << r.threads
          << ", \"bytes_per_element\": " << r.bytes_per_element << ", \"median_seconds\": " << r.seconds << ", \"elements_per_s\": " << r.elements_per_s()
          << ", \"gb_per_s\": " << r.gb_per_s() << ", \"percent_of_bandwidth\": " << 100 * r.gb_per_s() / peak_gbs
          << ", \"percent_of_same_traffic_bandwidth\": " << 100 * r.gb_per_s() / same_traffic_gbs << "}";
    }
    out << "\n  ]\n}\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
