// GPU benchmarks' timing: event-timed samples on a stream and their median.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "polyshard/core/cuda/stream.hpp"

namespace bench {

/// Milliseconds per call of one timed sample: `inner` calls back to back between two events.
inline double sample_ms(const std::function<void()>& f, int inner, cudaStream_t stream) {
  polyshard::cuda::Event start(true), stop(true);
  start.record(stream);
  for (int i = 0; i < inner; ++i) f();
  stop.record(stream);
  stop.synchronize();
  return double(stop.elapsed_ms_since(start)) / inner;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench
