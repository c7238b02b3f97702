// A process-wide pool of worker threads for elementwise host kernels (the optimizers' updates,
// the step's casts between precisions): started once, woken for each call, so that a call split
// across cores costs a wake-up rather than a thread start per core (tens of microseconds each,
// paid for every unit of every step); and parallel_ranges, which splits a range over it.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

namespace polyshard::detail {

/// Runs `job(part)` for parts 0..parts-1, the calling thread taking part 0 and the pool's
/// workers the others. One job runs on the pool at a time: a call made while the pool is busy
/// (another rank's thread stepping at the same moment, or a job started from inside a job) runs
/// every part on its own calling thread instead, which gives the same results for any
/// elementwise job, and never waits for the other.
class CpuWorkers {
 public:
  /// `workers` threads besides the caller; started now, joined by the destructor.
  explicit CpuWorkers(unsigned workers) {
    threads_.reserve(workers);
    for (unsigned i = 0; i < workers; ++i) threads_.emplace_back([this, i] { serve(i + 1); });
  }
  ~CpuWorkers() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  CpuWorkers(const CpuWorkers&) = delete;
  CpuWorkers& operator=(const CpuWorkers&) = delete;

  /// The parts a call can run at once: the workers and the caller.
  unsigned capacity() const { return static_cast<unsigned>(threads_.size()) + 1; }

  /// Runs job(0) .. job(parts - 1) and returns when all have finished; rethrows the first
  /// exception a part threw (after every part has finished).
  void run(unsigned parts, const std::function<void(unsigned)>& job) {
    // A forked child has none of the parent's threads: it runs the job itself.
    if (parts <= 1 || threads_.empty() || ::getpid() != owner_) return run_here(parts, job);
    bool idle = false;
    if (!busy_.compare_exchange_strong(idle, true, std::memory_order_acquire)) return run_here(parts, job);
    struct Release {
      std::atomic<bool>& busy;
      ~Release() { busy.store(false, std::memory_order_release); }
    } release{busy_};
    const unsigned helpers = std::min(parts, capacity()) - 1;
    {
      std::lock_guard lock(mutex_);
      job_ = &job;
      parts_ = parts;
      next_part_ = 1;  // part 0 is the caller's
      helpers_ = helpers;
      running_ = helpers;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr error;
    try {
      job(0);
    } catch (...) {
      error = std::current_exception();
    }
    take_parts(error);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return running_ == 0; });
    job_ = nullptr;
    if (!error) error = error_;
    lock.unlock();
    if (error) std::rethrow_exception(error);
  }

 private:
  static void run_here(unsigned parts, const std::function<void(unsigned)>& job) {
    for (unsigned p = 0; p < parts; ++p) job(p);
  }

  /// Takes parts left over (more parts than threads) until none is left.
  void take_parts(std::exception_ptr& error) {
    for (;;) {
      unsigned part;
      {
        std::lock_guard lock(mutex_);
        if (next_part_ >= parts_) return;
        part = next_part_++;
      }
      try {
        (*job_)(part);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
  }

  void serve(unsigned index) {
    std::size_t seen = 0;
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || (generation_ != seen && index <= helpers_); });
      if (stopping_) return;
      seen = generation_;
      lock.unlock();
      std::exception_ptr error;
      take_parts(error);
      lock.lock();
      if (error && !error_) error_ = error;
      if (--running_ == 0) done_.notify_one();
    }
  }

  const pid_t owner_ = ::getpid();
  std::vector<std::thread> threads_;
  std::atomic<bool> busy_{false};  // a call is using the pool
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(unsigned)>* job_ = nullptr;
  unsigned parts_ = 0, next_part_ = 0, helpers_ = 0, running_ = 0;
  std::size_t generation_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
};

/// The process's pool: one worker per hardware thread beyond the caller's, started on first use.
inline CpuWorkers& cpu_workers() {
  static CpuWorkers pool(std::max(1u, std::thread::hardware_concurrency()) - 1);
  return pool;
}

// Below this many elements per thread, starting a thread costs more than it saves.
inline constexpr std::size_t min_elements_per_thread = std::size_t{1} << 18;

/// How many threads one elementwise host pass may use (set_optimizer_threads; 0: all).
inline std::atomic<unsigned>& optimizer_threads_setting() {
  static std::atomic<unsigned> threads{0};
  return threads;
}

/// Runs `range(begin, end)` over [0, n), split at cache-line boundaries into one part per thread
/// the setting allows, on the process's worker pool (core/cpu_workers.hpp); the calling thread
/// takes the first part.
/// `per_thread`: the fewest items worth a thread of their own.
template <class Fn>
void parallel_ranges(std::size_t n, Fn&& range, std::size_t per_thread = min_elements_per_thread) {
  unsigned threads = optimizer_threads_setting().load(std::memory_order_relaxed);
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(1, n / std::max<std::size_t>(1, per_thread))));
  if (threads <= 1) {
    range(std::size_t{0}, n);
    return;
  }
  constexpr std::size_t align = 64;  // elements: a whole number of packets and of cache lines
  const std::size_t chunk = (n / threads + align - 1) / align * align;
  cpu_workers().run(threads, [&](unsigned part) {
    const std::size_t begin = std::min(n, part * chunk);
    const std::size_t end = part + 1 == threads ? n : std::min(n, begin + chunk);
    if (begin < end) range(begin, end);
  });
}

}  // namespace polyshard::detail
