// Benchmark reporting: medians of repeated timings, a table on stdout, JSON beside it.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace bench {

/// Median wall time in seconds of `repeats` calls of `f`, after `warmup` untimed calls.
inline double median_seconds(const std::function<void()>& f, int repeats = 5, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

namespace detail {

// The FMA peak kernels: `accumulators` independent chains of fused multiply-adds, enough to keep
// every FMA port busy through the instruction's latency (2 ports x 4 cycles on current x86 cores:
// 8 chains; 12 leave a margin). Explicit FMA instructions on the widest registers the machine
// has, chosen when the program runs: a plain `a * b + c` is two instructions in builds with
// -ffp-contract=off (polyshard's own), which would measure half the peak and let a BLAS exceed it.
inline constexpr int fma_accumulators = 12;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
[[gnu::target("avx512f")]] inline float fma_chains_avx512(long iterations) {
  __m512 acc[fma_accumulators];
  for (int i = 0; i < fma_accumulators; ++i) acc[i] = _mm512_set1_ps(0.001f * float(i));
  const __m512 mul = _mm512_set1_ps(0.9999f), add = _mm512_set1_ps(0.0001f);
  for (long k = 0; k < iterations; ++k) {
#pragma GCC unroll 12  // every chain in a register, at any optimization level
    for (int i = 0; i < fma_accumulators; ++i) acc[i] = _mm512_fmadd_ps(acc[i], mul, add);
  }
  alignas(64) float lanes[16];
  __m512 sum = acc[0];
  for (int i = 1; i < fma_accumulators; ++i) sum = _mm512_add_ps(sum, acc[i]);
  _mm512_store_ps(lanes, sum);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}
[[gnu::target("avx2,fma")]] inline float fma_chains_avx2(long iterations) {
  __m256 acc[fma_accumulators];
  for (int i = 0; i < fma_accumulators; ++i) acc[i] = _mm256_set1_ps(0.001f * float(i));
  const __m256 mul = _mm256_set1_ps(0.9999f), add = _mm256_set1_ps(0.0001f);
  for (long k = 0; k < iterations; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < fma_accumulators; ++i) acc[i] = _mm256_fmadd_ps(acc[i], mul, add);
  }
  alignas(32) float lanes[8];
  __m256 sum = acc[0];
  for (int i = 1; i < fma_accumulators; ++i) sum = _mm256_add_ps(sum, acc[i]);
  _mm256_store_ps(lanes, sum);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}
#endif

// Without x86 FMA: std::fma, one lane per chain (a lower bound of the peak, said so by the name).
inline float fma_chains_scalar(long iterations) {
  float acc[fma_accumulators];
  for (int i = 0; i < fma_accumulators; ++i) acc[i] = 0.001f * float(i);
  for (long k = 0; k < iterations; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < fma_accumulators; ++i) acc[i] = std::fma(acc[i], 0.9999f, 0.0001f);
  }
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

struct FmaProbe {
  const char* name;  // the instructions measured
  int lanes;
  float (*chains)(long);
};

inline FmaProbe widest_fma() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {"AVX-512 FMA", 16, fma_chains_avx512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {"AVX2 FMA", 8, fma_chains_avx2};
#endif
  return {"scalar fma", 1, fma_chains_scalar};
}

}  // namespace detail

/// The instructions measure_fma_peak_gflops() times on this machine ("AVX-512 FMA", ...).
inline const char* fma_peak_instructions() { return detail::widest_fma().name; }

/// Theoretical-ceiling probe: fp32 FMA throughput of every core, in GFLOP/s, with the widest
/// FMA instructions the machine runs (detail::widest_fma), whatever the build's flags.
inline double measure_fma_peak_gflops(int threads = 0) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  const detail::FmaProbe probe = detail::widest_fma();
  const long iterations = 20'000'000;
  std::vector<float> sinks(static_cast<std::size_t>(threads));
  // A ceiling: the best of several runs, since anything else on the machine only slows it.
  double seconds = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { sinks[static_cast<std::size_t>(t)] = probe.chains(iterations); });
    for (auto& th : pool) th.join();
    seconds = std::min(seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * probe.lanes * detail::fma_accumulators * double(iterations) * threads / seconds / 1e9;
}

/// Rows of named numeric and text columns, printed as an aligned table and saved as JSON.
class Table {
 public:
  explicit Table(std::string title) : title_(std::move(title)) {}

  Table& row() {
    rows_.emplace_back();
    return *this;
  }
  Table& set(const std::string& column, double value, int precision = 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", precision, value);
    return put(column, buf, std::to_string(value));
  }
  Table& set(const std::string& column, const std::string& text) { return put(column, text, "\"" + text + "\""); }

  void print() const {
    std::printf("\n%s\n", title_.c_str());
    std::vector<std::size_t> width;
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      std::size_t w = columns_[c].size();
      for (const auto& r : rows_)
        if (auto it = r.find(columns_[c]); it != r.end()) w = std::max(w, it->second.first.size());
      width.push_back(w);
    }
    for (std::size_t c = 0; c < columns_.size(); ++c) std::printf("| %-*s ", int(width[c]), columns_[c].c_str());
    std::printf("|\n");
    for (std::size_t c = 0; c < columns_.size(); ++c) std::printf("|%s", std::string(width[c] + 2, '-').c_str());
    std::printf("|\n");
    for (const auto& r : rows_) {
      for (std::size_t c = 0; c < columns_.size(); ++c) {
        auto it = r.find(columns_[c]);
        std::printf("| %*s ", int(width[c]), it == r.end() ? "" : it->second.first.c_str());
      }
      std::printf("|\n");
    }
  }

  /// {"benchmark": title, "rows": [{column: value, ...}, ...]}
  void write_json(const std::string& path) const {
    std::ofstream out(path);
    out << "{\"benchmark\": \"" << title_ << "\", \"rows\": [";
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      out << (i ? ", " : "") << "{";
      bool first = true;
      for (const auto& c : columns_) {
        auto it = rows_[i].find(c);
        if (it == rows_[i].end()) continue;
        out << (first ? "" : ", ") << "\"" << c << "\": " << it->second.second;
        first = false;
      }
      out << "}";
    }
    out << "]}\n";
  }

 private:
  Table& put(const std::string& column, std::string shown, std::string json) {
    if (std::find(columns_.begin(), columns_.end(), column) == columns_.end()) columns_.push_back(column);
    rows_.back()[column] = {std::move(shown), std::move(json)};
    return *this;
  }

  std::string title_;
  std::vector<std::string> columns_;
  std::vector<std::map<std::string, std::pair<std::string, std::string>>> rows_;
};

/// An option of a benchmark's own, beside --json, --quick and --help: `value` names what it takes
/// ("DIR"), empty for a flag.
struct Option {
  std::string name;
  std::string value;
  std::string help;
};

/// The value of `--json FILE` (or the program's default), whether `--quick` was given, and the
/// program's own options that were.
struct Args {
  std::string json;
  bool quick = false;
  std::map<std::string, std::string> given;  // name -> value ("" for a flag)

  bool has(const std::string& name) const { return given.count(name) > 0; }
  /// The whole number given to `name`, or `fallback`; a value that is not one stops the program.
  long long number(const std::string& name, long long fallback) const {
    const auto it = given.find(name);
    if (it == given.end()) return fallback;
    long long v = 0;
    const char* end = it->second.data() + it->second.size();
    const auto [ptr, ec] = std::from_chars(it->second.data(), end, v);
    if (ec != std::errc() || ptr != end) {
      std::fprintf(stderr, "%s expects a whole number, not '%s'\n", name.c_str(), it->second.c_str());
      std::exit(2);
    }
    return v;
  }
};

/// Reads --json FILE (default `fallback`), --quick and the program's `own` options. --help prints
/// them and exits; any other argument, or an option without its value, stops the program naming
/// it (exit 2), where a long measurement would otherwise run with the argument ignored.
inline Args parse_args(int argc, char** argv, std::string fallback, const std::vector<Option>& own = {}) {
  Args a;
  a.json = std::move(fallback);
  const std::string program = argc > 0 ? argv[0] : "benchmark";
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const auto mine = std::find_if(own.begin(), own.end(), [&](const Option& o) { return o.name == s; });
    const bool takes_value = s == "--json" || (mine != own.end() && !mine->value.empty());
    if (takes_value && i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value (see --help)\n", program.c_str(), s.c_str());
      std::exit(2);
    }
    if (s == "--json") {
      a.json = argv[++i];
    } else if (s == "--quick") {
      a.quick = true;
    } else if (mine != own.end()) {
      a.given[s] = takes_value ? argv[++i] : "";
    } else if (s == "--help" || s == "-h") {
      std::printf("usage: %s [--quick] [--json FILE]", program.c_str());
      for (const Option& o : own) std::printf(" [%s%s%s]", o.name.c_str(), o.value.empty() ? "" : " ", o.value.c_str());
      std::printf("\n  --quick      a smaller, shorter run\n  --json FILE  where the JSON goes (default %s)\n",
                  a.json.c_str());
      for (const Option& o : own) std::printf("  %s %s  %s\n", o.name.c_str(), o.value.c_str(), o.help.c_str());
      std::exit(0);
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s' (see --help)\n", program.c_str(), s.c_str());
      std::exit(2);
    }
  }
  return a;
}

}  // namespace bench
