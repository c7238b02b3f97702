// (kernels to come)
#include "polyshard/core/cuda/device_math.cuh"
