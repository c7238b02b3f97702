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

 private:
  std::shared_ptr<detail::comm::PendingOp> op_;
};

}  // namespace polyshard
