// One background thread that runs the jobs handed to it in the order they came: work a thread
// must not wait for where it arises (the offloaded optimizer step of a unit whose gradients
// landed while backward goes on), collected later at one point (wait).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace polyshard::detail {

class SerialWorker {
 public:
  SerialWorker() : thread_([this] { serve(); }) {}
  ~SerialWorker() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  /// Queues `job` behind the jobs already handed over. Once a job has thrown, the jobs after it
  /// are dropped until the next wait(): they belong to the same failed piece of work.
  void submit(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_all();
  }

  /// Returns when every job handed over has run (or was dropped); rethrows the first exception
  /// one threw since the last wait.
  void wait() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return jobs_.empty() && !running_; });
    if (std::exception_ptr error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
  }

  /// wait(), keeping no error: after an error has already left the caller.
  void settle() noexcept {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return jobs_.empty() && !running_; });
    error_ = nullptr;
  }

 private:
  void serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, with nothing left
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      if (error_) {  // an earlier job of the same work failed
        if (jobs_.empty()) idle_.notify_all();
        continue;
      }
      running_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      job = nullptr;  // what it captured goes before the waiter is told
      lock.lock();
      running_ = false;
      if (error && !error_) error_ = error;
      if (jobs_.empty()) idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool running_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members it reads exist
};

}  // namespace polyshard::detail
