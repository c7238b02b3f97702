// Checks a CUDA runtime call and turns a failure into polyshard::Error naming the call.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "polyshard/core/error.hpp"

namespace polyshard::cuda {

/// Throws polyshard::Error("polyshard: <call> failed: <name>: <description> (<file>:<line>)").
inline void check(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc == cudaSuccess) return;
  throw Error(std::string("polyshard: ") + call + " failed: " + cudaGetErrorName(rc) + ": " +
              cudaGetErrorString(rc) + " (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace polyshard::cuda

/// Runs a CUDA runtime call and throws polyshard::Error when it does not return cudaSuccess.
#define POLYSHARD_CUDA_CHECK(call) ::polyshard::cuda::check((call), #call, __FILE__, __LINE__)

/// After a kernel launch: a bad launch configuration shows up here, not at the next sync.
#define POLYSHARD_CUDA_CHECK_LAUNCH(name) ::polyshard::cuda::check(cudaGetLastError(), name, __FILE__, __LINE__)
