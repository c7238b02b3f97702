// The communication thread of a CPU communicator: runs collectives one at a time in the order
// they were issued, so that async calls overlap the caller's compute yet every rank issues the
// same sequence.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "polyshard/comm/call_site.hpp"
#include "polyshard/comm/comm_handle.hpp"

namespace polyshard::detail::comm {

class CommWorker {
 public:
  CommWorker() = default;
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;
  ~CommWorker() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Queues `task` behind everything issued before; the thread starts on first use. The task
  /// runs under the caller's CallSite, so that its collective is named where it was issued.
  CommHandle submit(std::function<void()> task) {
    auto state = std::make_shared<TaskState>();
    if (!CallSite::current().empty())
      task = [site = CallSite::current(), inner = std::move(task)] {
        CallSite scope(site);
        inner();
      };
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(std::move(task), state);
      ++pending_;
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
    return CommHandle(state);
  }

  /// Runs `task` to completion in order: on the calling thread when nothing is queued or
  /// running (no hand-off latency), else behind the queued work.
  void run(std::function<void()> task) {
    {
      std::unique_lock lock(mutex_);
      if (pending_ != 0) {
        lock.unlock();
        submit(std::move(task)).wait();
        return;
      }
      pending_ = 1;  // no async call can slip in: the caller is this thread
    }
    struct Release {
      CommWorker* w;
      ~Release() {
        std::lock_guard lock(w->mutex_);
        w->pending_ = 0;
      }
    } release{this};
    task();
  }

 private:
  void loop() {
    for (;;) {
      std::pair<std::function<void()>, std::shared_ptr<TaskState>> item;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything issued has run
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        item.first();
      } catch (...) {
        error = std::current_exception();
      }
      {
        // Before finishing the handle, so that a blocking call right after wait() runs inline.
        std::lock_guard lock(mutex_);
        --pending_;
      }
      item.second->finish(error);
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<TaskState>>> queue_;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace polyshard::detail::comm
