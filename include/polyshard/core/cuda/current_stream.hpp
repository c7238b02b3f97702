// The stream a thread's tensor work goes to: allocations, copies and kernels of Tensor<T, Cuda>
// are ordered on it. Each thread starts on its per-thread default stream; a scope switches it
// (for example to the communication stream while a unit is gathered).
#pragma once

#include <cuda_runtime_api.h>

namespace polyshard::cuda {

namespace detail {
inline cudaStream_t& current_stream_slot() {
  thread_local cudaStream_t stream = cudaStreamPerThread;
  return stream;
}
}  // namespace detail

/// The calling thread's current stream.
inline cudaStream_t current_stream() { return detail::current_stream_slot(); }

/// Makes `stream` the thread's current stream until the scope ends.
class StreamScope {
 public:
  explicit StreamScope(cudaStream_t stream) : previous_(detail::current_stream_slot()) {
    detail::current_stream_slot() = stream;
  }
  ~StreamScope() { detail::current_stream_slot() = previous_; }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  cudaStream_t previous_;
};

}  // namespace polyshard::cuda
