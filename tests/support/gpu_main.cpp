// main() of every GPU test program: runs the Catch2 session where a CUDA device is visible and
// otherwise prints why and exits with 77, which CTest reports as skipped (never as passed). A
// session whose cases all passed but some of which found too few devices (gpu_devices.hpp) exits
// with 77 too, on a GPU machine; on the emulated device (four devices unless
// POLYSHARD_EMULATION_DEVICES says otherwise) it fails.
//
// Compiled with POLYSHARD_GPU_MAIN_HOST_CASES, for a program whose host cases must run on every
// machine (test_comm_nccl), the session runs without a device too: its device cases then call
// have_devices, and the program skips by the same rule once every case that ran has passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string_view>

#include "polyshard/core/cuda/runtime.hpp"
#include "support/gpu_devices.hpp"

#ifdef POLYSHARD_GPU_MAIN_HOST_CASES
inline constexpr bool runs_without_device = true;
#else
inline constexpr bool runs_without_device = false;
#endif

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::string_view(argv[i]).starts_with("--list");
  const auto devices = polyshard::cuda::available_devices();
  if (!listing) {
    if (devices) {
      std::printf("running on %s\n", polyshard::cuda::device_description(0).c_str());
    } else if (!runs_without_device) {
      std::printf("SKIPPED: no CUDA device (%s): the GPU tests in %s did not run\n", devices.reason.c_str(), argv[0]);
      return 77;
    }
  }
  const int rc = Catch::Session().run(argc, argv);
  const int short_of_devices = polyshard::test::cases_short_of_devices.load();
  if (rc != 0 || listing || short_of_devices == 0) return rc;
  if (devices && polyshard::cuda::is_emulated_device(0)) {
    std::printf("FAILED: %d of the test cases found fewer devices than they need on the emulated device, where "
                "every case must run\n",
                short_of_devices);
    return 1;
  }
  std::printf("SKIPPED: %d of the test cases in %s need more CUDA devices than are visible: they did not run\n",
              short_of_devices, argv[0]);
  return 77;
}
