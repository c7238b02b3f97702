// The handle an asynchronous collective returns: wait on it before touching the buffers.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

namespace polyshard {

namespace detail::comm {
/// What a backend's pending operation offers a handle.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  /// Blocks until the operation completed; rethrows its failure.
  virtual void wait() = 0;
  /// True once the operation completed (successfully or not); never blocks.
  virtual bool ready() = 0;
  /// Orders the work the calling thread enqueues next on its device stream after the operation,
  /// without blocking; false where the backend cannot (the host backends).
  virtual bool wait_on_device() { return false; }
};

/// A pending operation completed by another thread (the CPU backends' communication thread).
class TaskState final : public PendingOp {
 public:
  void finish(std::exception_ptr error) {
    {
      std::lock_guard lock(mutex_);
      error_ = std::move(error);
      done_ = true;
    }
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool ready() override {
    std::lock_guard lock(mutex_);
    return done_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};
}  // namespace detail::comm

/// A collective in flight. The buffers passed to the collective belong to it until wait()
/// returns: neither read nor write them before. Dropping a handle does not cancel the
/// collective (it still runs, in order); it only gives up the chance to see its error.
class CommHandle {
 public:
  /// A handle of nothing: already complete.
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<detail::comm::PendingOp> op) : op_(std::move(op)) {}

  /// Blocks until the collective completed; throws polyshard::Error if it failed (timeout,
  /// mismatch, a failed rank). Calling it again repeats the outcome.
  void wait() {
    if (op_) op_->wait();
  }
  /// True once the collective completed; never blocks.
  bool ready() const { return !op_ || op_->ready(); }
  /// Where the backend runs collectives on a device stream (NCCL): makes the calling thread's
  /// current stream (cuda::current_stream()) wait for the collective, without blocking the host,
  /// and returns true; the work enqueued on that stream afterwards may use the buffers. The host
  /// must still wait() before it reads them itself, and to learn of a failure. False, doing
  /// nothing, where the backend has no such stream (the host backends): wait() instead.
  bool wait_on_device() { return !op_ || op_->wait_on_device(); }

 private:
  std::shared_ptr<detail::comm::PendingOp> op_;
};

}  // namespace polyshard
