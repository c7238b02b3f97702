// Whether CUDA can run here, and why not: a machine without a driver or a GPU answers with a
// reason instead of an exception, so tests and programs can say so and skip.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace polyshard::cuda {

/// The devices this process sees, or none with the runtime's reason.
struct DeviceAvailability {
  int count = 0;
  std::string reason;  // empty when count > 0
  explicit operator bool() const { return count > 0; }
};

inline DeviceAvailability available_devices() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // not sticky: later calls must not see this one's error
    return {0, std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc)};
  }
  if (count == 0) return {0, "the CUDA runtime found no device"};
  return {count, {}};
}

/// The name the emulated device (emulation/, docs/cuda.md) gives itself in cudaDeviceProp.
inline constexpr char emulated_device_name[] = "polyshard emulated CUDA device";

/// Whether `device` is the emulated device rather than a GPU: for what must differ between them
/// (the emulation has four devices, so a test that needs several must never skip there).
inline bool is_emulated_device(int device) {
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, device) == cudaSuccess && std::string(p.name) == emulated_device_name;
}

/// The device's name and compute capability, as "NVIDIA H200 (sm_90)".
inline std::string device_description(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "device " + std::to_string(device);
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ")";
}

}  // namespace polyshard::cuda
