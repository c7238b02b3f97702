// The 16-bit element types by name only, for code that must not see Eigen (CUDA translation
// units): pointers to them cross from host code into kernels, where they become CUDA's types.
#pragma once

namespace Eigen {
struct half;
struct bfloat16;
}  // namespace Eigen

namespace polyshard {
using half = Eigen::half;
using bfloat16 = Eigen::bfloat16;
}  // namespace polyshard
