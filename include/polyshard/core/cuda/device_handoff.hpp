// DeviceHandoff on CUDA: the handing thread's device and an event recorded on its current
// stream; the receiving thread makes that device current and its own per-thread default stream
// wait for the event, so that its copies read what the handing thread's kernels wrote.
#pragma once

#include <memory>

#include <cuda_runtime_api.h>

#include "polyshard/core/cuda/current_stream.hpp"
#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/cuda/stream.hpp"
#include "polyshard/core/device_handoff.hpp"

namespace polyshard {

template <>
class DeviceHandoff<Cuda> {
 public:
  /// The calling thread's device and the point its current stream has reached.
  static DeviceHandoff mark() {
    DeviceHandoff h;
    POLYSHARD_CUDA_CHECK(cudaGetDevice(&h.device_));
    h.point_ = std::make_shared<cuda::Event>();
    h.point_->record(cuda::current_stream());
    return h;
  }

  /// On the receiving thread: the marked device is current and the thread's work goes to its
  /// own per-thread default stream, which waits for the marked point; both as before afterwards.
  class Enter {
   public:
    explicit Enter(const DeviceHandoff& h) : stream_(cudaStreamPerThread) {
      POLYSHARD_CUDA_CHECK(cudaGetDevice(&previous_device_));
      POLYSHARD_CUDA_CHECK(cudaSetDevice(h.device_));
      h.point_->wait(cudaStreamPerThread);
    }
    ~Enter() { cudaSetDevice(previous_device_); }
    Enter(const Enter&) = delete;
    Enter& operator=(const Enter&) = delete;

   private:
    int previous_device_ = 0;
    cuda::StreamScope stream_;
  };

 private:
  int device_ = 0;
  std::shared_ptr<cuda::Event> point_;
};

}  // namespace polyshard
