// Benchmark reporting: medians of repeated timings, a table on stdout, JSON beside it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

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

/// Theoretical-ceiling probe: fp32 FMA throughput of every core, in GFLOP/s. Twelve
/// independent accumulator vectors hide the FMA latency; the compiler vectorizes them with
/// the widest registers -march=native allows.
inline double measure_fma_peak_gflops(int threads = 0) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  typedef float vec __attribute__((vector_size(64)));
  constexpr int lanes = 16, accumulators = 12;
  const long iterations = 20'000'000;
  auto kernel = [&](float* sink) {
    vec acc[accumulators];
    for (int i = 0; i < accumulators; ++i)
      for (int l = 0; l < lanes; ++l) acc[i][l] = 0.001f * float(i + l);
    vec mul, add;
    for (int l = 0; l < lanes; ++l) mul[l] = 0.9999f, add[l] = 0.0001f;
    for (long k = 0; k < iterations; ++k) {
#pragma GCC unroll 12
      for (int i = 0; i < accumulators; ++i) acc[i] = acc[i] * mul + add;
    }
    float s = 0;
    for (int i = 0; i < accumulators; ++i)
      for (int l = 0; l < lanes; ++l) s += acc[i][l];
    *sink = s;
  };
  std::vector<float> sinks(static_cast<std::size_t>(threads));
  // A ceiling: the best of several runs, since anything else on the machine only slows it.
  double seconds = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(kernel, &sinks[static_cast<std::size_t>(t)]);
    for (auto& th : pool) th.join();
    seconds = std::min(seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * lanes * accumulators * double(iterations) * threads / seconds / 1e9;
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

/// The value of `--json FILE` (or `fallback`), and whether `--quick` was given.
struct Args {
  std::string json;
  bool quick = false;
};
inline Args parse_args(int argc, char** argv, std::string fallback) {
  Args a{std::move(fallback)};
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--json" && i + 1 < argc) a.json = argv[++i];
    else if (s == "--quick") a.quick = true;
  }
  return a;
}

}  // namespace bench
