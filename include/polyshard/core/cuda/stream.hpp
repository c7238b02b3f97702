// Owning handles for a CUDA stream and an event: how compute and communication are ordered
// without a host synchronisation (record on one stream, wait on the other).
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "polyshard/core/cuda/error.hpp"

namespace polyshard::cuda {

/// A non-blocking stream (no implicit ordering with the legacy default stream).
class Stream {
 public:
  explicit Stream(int priority = 0) {
    POLYSHARD_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
  }
  ~Stream() {
    if (stream_) cudaStreamDestroy(stream_);
  }
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(stream_, o.stream_);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  operator cudaStream_t() const { return stream_; }
  void synchronize() const { POLYSHARD_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

/// An event; without timing unless asked, which makes record and wait cheaper.
class Event {
 public:
  explicit Event(bool timing = false) {
    POLYSHARD_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() {
    if (event_) cudaEventDestroy(event_);
  }
  Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(event_, o.event_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  /// Marks the point in `stream` that a later wait() orders after.
  void record(cudaStream_t stream) { POLYSHARD_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  /// Makes `stream`'s later work wait for the recorded point; the host does not wait.
  void wait(cudaStream_t stream) const { POLYSHARD_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
  void synchronize() const { POLYSHARD_CUDA_CHECK(cudaEventSynchronize(event_)); }
  /// Milliseconds from `start` to this event (both recorded with timing).
  float elapsed_ms_since(const Event& start) const {
    float ms = 0;
    POLYSHARD_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace polyshard::cuda
