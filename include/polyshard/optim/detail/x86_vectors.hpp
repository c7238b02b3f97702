// The host optimizer kernels compiled for AVX2 and for AVX-512 whatever the program's -march,
// and the choice between them at run time (optim/detail/cpu_isa.hpp): each instruction set
// defines its vector type and includes the shared kernel bodies (vector_updates.inc) under its
// own target pragma, so that no instruction it lacks can reach the other's code.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "polyshard/core/dtype.hpp"
#include "polyshard/optim/detail/adam_constants.hpp"
#include "polyshard/optim/detail/cpu_isa.hpp"
#include "polyshard/optim/detail/sgd_constants.hpp"

#if POLYSHARD_X86_DISPATCH
#include <immintrin.h>

// ---- AVX2 (with F16C for half; no FMA, so that a product and a sum are never fused) ----------
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif
namespace polyshard::detail::avx2 {

struct Vec {
  static constexpr std::size_t lanes = 8;
  using F = __m256;
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const bfloat16* p) {  // bfloat16 is float's upper half: widened exactly by a shift
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static F load(const half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static void store(bfloat16* p, F x) {
    // Round to nearest even on the bits (Eigen's float_to_bfloat16_rtne); NaN becomes the quiet
    // NaN of its sign.
    const __m256i u = _mm256_castps_si256(x);
    const __m256i upper = _mm256_srli_epi32(u, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(upper, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i nan = _mm256_or_si256(_mm256_and_si256(upper, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7fc0));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i bits = _mm256_blendv_epi8(rounded, nan, is_nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void store(half* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  // Doubles, half as many lanes: F's lower and upper halves widened exactly.
  using D = __m256d;
  static D load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, D x) { _mm256_storeu_pd(p, x); }
  static D widen_low(F x) { return _mm256_cvtps_pd(_mm256_castps256_ps128(x)); }
  static D widen_high(F x) { return _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)); }
  static D add_square(D acc, D x) { return _mm256_add_pd(acc, _mm256_mul_pd(x, x)); }
};

#include "polyshard/optim/detail/vector_updates.inc"

}  // namespace polyshard::detail::avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// ---- AVX-512 (F, BW, VL, DQ) ------------------------------------------------------------------
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")
#endif
namespace polyshard::detail::avx512 {

struct Vec {
  static constexpr std::size_t lanes = 16;
  using F = __m512;
  // The masked forms of the intrinsics, every lane on: GCC 12 warns (-Wmaybe-uninitialized)
  // about the undefined source operand of the plain forms.
  static constexpr __mmask16 all = 0xFFFF;
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const bfloat16* p) {
    const __m512i wide = _mm512_maskz_cvtepu16_epi32(all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, wide, 16));
  }
  static F load(const half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static void store(bfloat16* p, F x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i upper = _mm512_maskz_srli_epi32(all, u, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(upper, _mm512_set1_epi32(1)));
    const __m512i rounded = _mm512_maskz_srli_epi32(all, _mm512_add_epi32(u, bias), 16);
    const __m512i nan = _mm512_or_si512(_mm512_and_si512(upper, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
    const __m512i bits = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_maskz_cvtepi32_epi16(all, bits));
  }
  static void store(half* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_mask_sqrt_ps(a, all, a); }
  using D = __m512d;
  static D load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, D x) { _mm512_storeu_pd(p, x); }
  static D widen_low(F x) { return _mm512_maskz_cvtps_pd(0xFF, _mm512_castps512_ps256(x)); }
  static D widen_high(F x) { return _mm512_maskz_cvtps_pd(0xFF, _mm512_maskz_extractf32x8_ps(0xFF, x, 1)); }
  static D add_square(D acc, D x) { return _mm512_add_pd(acc, _mm512_mul_pd(x, x)); }
};

#include "polyshard/optim/detail/vector_updates.inc"

}  // namespace polyshard::detail::avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // POLYSHARD_X86_DISPATCH

namespace polyshard::detail {

/// The element types the vector kernels read gradients in and write the compute copy in.
template <class T>
inline constexpr bool vector_element_v = std::is_same_v<T, float> || std::is_same_v<T, bfloat16> ||
                                         std::is_same_v<T, half>;

/// adam_range on `isa`'s kernels; false (nothing done) for the portable kernels, which the
/// caller runs instead.
template <class G, class C>
bool vector_adam_range(CpuIsa isa, std::size_t n, float* param, const G* grad, float* exp_avg, float* exp_avg_sq,
                       C* copy, const AdamConstants<float>& k) {
#if POLYSHARD_X86_DISPATCH
  if constexpr (vector_element_v<G> && vector_element_v<C>) {
    if (isa == CpuIsa::Avx512) return avx512::adam_range(n, param, grad, exp_avg, exp_avg_sq, copy, k), true;
    if (isa == CpuIsa::Avx2) return avx2::adam_range(n, param, grad, exp_avg, exp_avg_sq, copy, k), true;
  }
#endif
  return false;
}

/// sgd_range on `isa`'s kernels, as vector_adam_range.
template <class G, class C>
bool vector_sgd_range(CpuIsa isa, std::size_t n, float* param, const G* grad, float* momentum_buffer, C* copy,
                      const SgdConstants<float>& k) {
#if POLYSHARD_X86_DISPATCH
  if constexpr (vector_element_v<G> && vector_element_v<C>) {
    if (isa == CpuIsa::Avx512) return avx512::sgd_range(n, param, grad, momentum_buffer, copy, k), true;
    if (isa == CpuIsa::Avx2) return avx2::sgd_range(n, param, grad, momentum_buffer, copy, k), true;
  }
#endif
  return false;
}

/// add_squares on `isa`'s kernels: the number of elements summed (whole groups of Lanes), 0
/// for the portable kernels, which the caller runs instead.
template <std::size_t Lanes, class G>
std::size_t vector_add_squares(CpuIsa isa, std::size_t n, const G* values, double* acc) {
#if POLYSHARD_X86_DISPATCH
  if constexpr (vector_element_v<G>) {
    if (isa == CpuIsa::Avx512) return avx512::add_squares<Lanes>(n, values, acc);
    if (isa == CpuIsa::Avx2) return avx2::add_squares<Lanes>(n, values, acc);
  }
#endif
  return 0;
}

/// scale_range on `isa`'s kernels, as vector_adam_range.
template <class G>
bool vector_scale_range(CpuIsa isa, std::size_t n, G* values, float factor) {
#if POLYSHARD_X86_DISPATCH
  if constexpr (vector_element_v<G>) {
    if (isa == CpuIsa::Avx512) return avx512::scale_range(n, values, factor), true;
    if (isa == CpuIsa::Avx2) return avx2::scale_range(n, values, factor), true;
  }
#endif
  return false;
}

}  // namespace polyshard::detail
