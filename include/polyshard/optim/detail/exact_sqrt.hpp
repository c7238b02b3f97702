// A correctly rounded square root of a SIMD packet, for the optimizer kernels.
//
// Eigen's own psqrt on AVX and AVX-512 packets (with EIGEN_FAST_MATH, its default) is a
// reciprocal-square-root estimate refined by Newton steps: 1-2 bits short in float, and it flushes
// denormal inputs to zero. The optimizers promise PyTorch's update, whose sqrt is IEEE-exact, so
// they take the hardware sqrt instruction of each packet type instead, and std::sqrt for the
// scalar "packets" of a target Eigen does not vectorize.
#pragma once

#include <Eigen/Core>
#include <cmath>

#if defined(EIGEN_VECTORIZE_SSE2) || defined(EIGEN_VECTORIZE_AVX) || defined(EIGEN_VECTORIZE_AVX512)
#include <immintrin.h>
#elif defined(EIGEN_VECTORIZE_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace polyshard::detail {

inline float exact_psqrt(float x) { return std::sqrt(x); }
inline double exact_psqrt(double x) { return std::sqrt(x); }

#if defined(EIGEN_VECTORIZE_SSE2)
inline __m128 exact_psqrt(__m128 x) { return _mm_sqrt_ps(x); }
inline __m128d exact_psqrt(__m128d x) { return _mm_sqrt_pd(x); }
#endif
#if defined(EIGEN_VECTORIZE_AVX)
inline __m256 exact_psqrt(__m256 x) { return _mm256_sqrt_ps(x); }
inline __m256d exact_psqrt(__m256d x) { return _mm256_sqrt_pd(x); }
#endif
#if defined(EIGEN_VECTORIZE_AVX512)
// The masked forms, all lanes on: GCC 12 warns about the undefined source of the plain ones.
inline __m512 exact_psqrt(__m512 x) { return _mm512_mask_sqrt_ps(x, 0xFFFF, x); }
inline __m512d exact_psqrt(__m512d x) { return _mm512_mask_sqrt_pd(x, 0xFF, x); }
#endif
#if defined(EIGEN_VECTORIZE_NEON) && defined(__aarch64__)
inline float32x4_t exact_psqrt(float32x4_t x) { return vsqrtq_f32(x); }
inline float64x2_t exact_psqrt(float64x2_t x) { return vsqrtq_f64(x); }
#endif

}  // namespace polyshard::detail
