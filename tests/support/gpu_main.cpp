// main() of every GPU test program: runs the Catch2 session where a CUDA device is visible and
// otherwise prints why and exits with 77, which CTest reports as skipped (never as passed).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string_view>

#include "polyshard/core/cuda/runtime.hpp"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::string_view(argv[i]).starts_with("--list");
  if (!listing) {
    const auto devices = polyshard::cuda::available_devices();
    if (!devices) {
      std::printf("SKIPPED: no CUDA device (%s): the GPU tests in %s did not run\n", devices.reason.c_str(), argv[0]);
      return 77;
    }
    std::printf("running on %s\n", polyshard::cuda::device_description(0).c_str());
  }
  return Catch::Session().run(argc, argv);
}
