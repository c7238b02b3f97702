// Which vector instructions the host optimizer kernels use, chosen when the program runs: the
// machines polyshard runs on differ (some have AVX-512, some only AVX2), and a header-only
// library cannot assume its users compile with -march=native.
#pragma once

#include <atomic>
#include <cstdlib>
#include <string>

#include "polyshard/core/error.hpp"

// The x86 kernels are compiled for their instruction sets by target pragmas (GCC, Clang), into
// any program, whatever its -march; elsewhere (and under nvcc) the portable kernels run alone.
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDACC__) && !defined(POLYSHARD_NO_CPU_DISPATCH)
#define POLYSHARD_X86_DISPATCH 1
#else
#define POLYSHARD_X86_DISPATCH 0
#endif

#if POLYSHARD_X86_DISPATCH
#include <cpuid.h>
#endif

namespace polyshard {

/// The host optimizer kernels' instruction sets, widest last. Portable: Eigen's packets for the
/// target the program was compiled for (SSE2 on x86-64 without -march flags). Every choice gives
/// the same bits: the updates use only correctly rounded operations (+, -, *, /, sqrt; no fused
/// multiply-add in builds with -ffp-contract=off, as polyshard's own).
enum class CpuIsa { Portable, Avx2, Avx512 };

inline const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Portable: return "portable";
  }
  return "?";
}

/// The widest instruction set this machine runs (AVX-512: F, BW, VL, DQ; AVX2 with F16C).
inline CpuIsa detected_cpu_isa() {
#if POLYSHARD_X86_DISPATCH
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return CpuIsa::Avx512;
    // F16C from CPUID itself: some compilers' __builtin_cpu_supports do not know it.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    if (__builtin_cpu_supports("avx2") && f16c) return CpuIsa::Avx2;
    return CpuIsa::Portable;
  }();
  return isa;
#else
  return CpuIsa::Portable;
#endif
}

namespace detail {
/// The environment's POLYSHARD_CPU_ISA (portable, avx2, avx512), else the widest detected.
inline CpuIsa initial_optimizer_isa() {
  const char* env = std::getenv("POLYSHARD_CPU_ISA");
  if (env == nullptr || *env == '\0') return detected_cpu_isa();
  const std::string name = env;
  for (CpuIsa isa : {CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (name != cpu_isa_name(isa)) continue;
    POLYSHARD_CHECK(isa <= detected_cpu_isa(), "POLYSHARD_CPU_ISA=", name, ": this machine runs at most ",
                    cpu_isa_name(detected_cpu_isa()));
    return isa;
  }
  detail::throw_error("POLYSHARD_CPU_ISA=", name, ": expected portable, avx2 or avx512");
}
inline std::atomic<CpuIsa>& optimizer_isa_setting() {
  static std::atomic<CpuIsa> isa{initial_optimizer_isa()};
  return isa;
}
}  // namespace detail

/// The instruction set the host optimizer kernels use now.
inline CpuIsa optimizer_isa() { return detail::optimizer_isa_setting().load(std::memory_order_relaxed); }

/// Chooses the host optimizer kernels' instruction set (tests and benchmarks compare them);
/// throws polyshard::Error for one this machine does not run.
inline void set_optimizer_isa(CpuIsa isa) {
  POLYSHARD_CHECK(isa <= detected_cpu_isa(), "set_optimizer_isa(", cpu_isa_name(isa), "): this machine runs at most ",
                  cpu_isa_name(detected_cpu_isa()));
  detail::optimizer_isa_setting().store(isa, std::memory_order_relaxed);
}

}  // namespace polyshard
