// Chrome trace events per rank: spans of compute and communication, written as JSON that
// chrome://tracing and Perfetto open.
#pragma once

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "polyshard/core/error.hpp"

namespace polyshard {

/// The spans one rank records. Thread-safe: the communication thread records too.
/// Threads of a rank, by convention: 0 compute, 1 communication the rank waits for,
/// 100 + u reductions of unit u in flight.
class Trace {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Trace(int rank) : rank_(rank) {}

  /// Microseconds since a process-wide origin, so that the ranks of one process line up.
  static double now_us() {
    static const Clock::time_point origin = Clock::now();
    return std::chrono::duration<double, std::micro>(Clock::now() - origin).count();
  }

  /// Records a complete ("X") event.
  void complete(std::string name, const char* category, double start_us, double end_us, int tid = 0) {
    std::lock_guard lock(mutex_);
    events_.push_back({std::move(name), category, start_us, end_us - start_us, tid});
  }

  /// Records the span from its construction to its destruction.
  class Span {
   public:
    Span(Trace* trace, std::string name, const char* category, int tid = 0)
        : trace_(trace), name_(std::move(name)), category_(category), tid_(tid), start_(trace ? now_us() : 0) {}
    ~Span() {
      if (trace_) trace_->complete(std::move(name_), category_, start_, now_us(), tid_);
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Trace* trace_;
    std::string name_;
    const char* category_;
    int tid_;
    double start_;
  };

  int rank() const { return rank_; }
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }

  /// Writes the events of `ranks` into one file: one process per rank, named threads.
  static void write_json(const std::string& path, const std::vector<const Trace*>& ranks) {
    std::ofstream out(path);
    POLYSHARD_CHECK(out.good(), "Trace: cannot write '", path, "'");
    out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    bool first = true;
    auto sep = [&] {
      if (!first) out << ",\n";
      first = false;
    };
    for (const Trace* t : ranks) {
      std::lock_guard lock(t->mutex_);
      sep();
      out << R"({"name": "process_name", "ph": "M", "pid": )" << t->rank_ << R"(, "args": {"name": "rank )"
          << t->rank_ << "\"}}";
      std::vector<int> tids;
      for (const Event& e : t->events_)
        if (std::find(tids.begin(), tids.end(), e.tid) == tids.end()) tids.push_back(e.tid);
      for (int tid : tids) {
        sep();
        const std::string thread = tid == 0   ? "compute"
                                   : tid == 1 ? "communication (waited for)"
                                              : "reduction of unit " + std::to_string(tid - 100);
        out << R"({"name": "thread_name", "ph": "M", "pid": )" << t->rank_ << R"(, "tid": )" << tid
            << R"(, "args": {"name": ")" << thread << "\"}}";
      }
      for (const Event& e : t->events_) {
        sep();
        out << R"({"name": ")" << e.name << R"(", "cat": ")" << e.category << R"(", "ph": "X", "ts": )" << e.ts
            << R"(, "dur": )" << e.dur << R"(, "pid": )" << t->rank_ << R"(, "tid": )" << e.tid << "}";
      }
    }
    out << "\n]}\n";
    POLYSHARD_CHECK(out.good(), "Trace: error while writing '", path, "'");
  }

 private:
  struct Event {
    std::string name;
    const char* category;
    double ts, dur;
    int tid;
  };
  int rank_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

}  // namespace polyshard
