// The CUDA WMMA API (warp-wide matrix products on tensor cores) for kernel sources: <mma.h> under
// nvcc, the emulated device's own (polyshard/emulation/wmma.hpp) when the host compiler builds
// the kernels for the CPU. Device code only: include from .cu files.
#pragma once

#if defined(POLYSHARD_CUDA_EMULATION)
#include "polyshard/emulation/wmma.hpp"
#else
#include <mma.h>
#endif
