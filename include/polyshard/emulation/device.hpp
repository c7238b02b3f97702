// The device side of the emulated CUDA device: what nvcc gives a kernel source and g++ lacks
// (__shared__, the built-in variables, barriers, warp intrinsics, atomics, rounding intrinsics),
// and the launcher that replaces <<<grid, block, shared, stream>>>. Included by
// polyshard/core/cuda/device_math.cuh after the CUDA headers when POLYSHARD_CUDA_EMULATION is set.
#pragma once

#if !defined(POLYSHARD_CUDA_EMULATION)
#error "polyshard/emulation/device.hpp is for kernel sources compiled by a host compiler (POLYSHARD_CUDA_EMULATION)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "polyshard/emulation/grid.hpp"
#include "polyshard/emulation/runtime.hpp"

// ---- storage and launch qualifiers ------------------------------------------------------------------
// The CUDA headers define __global__, __device__, __host__ and __forceinline__ for a host compiler
// already (the first three as nothing). __shared__ they define as nothing too, which would give
// every thread its own array.

#undef __shared__
// One object per running block: the threads of a block are fibers on one OS thread, blocks of a
// grid run one after another on it, and grids of other streams run on other OS threads, each with
// its own copy. A plain __shared__ array keeps its values from the previous block instead of
// starting as garbage: the library's kernels declare theirs with POLYSHARD_SHARED.
#define __shared__ static thread_local

/// `POLYSHARD_SHARED(type, name, [dims]);` declares `__shared__ type name[dims]` (core/cuda/
/// launch.hpp on a GPU). Here the object is filled with 0xFF bytes (NaN in every float type) when
/// the first thread of each block reaches the declaration, as strict as a GPU whose shared memory
/// holds garbage: a kernel that reads what its block never wrote sees NaN, not the last block's
/// values or zeros.
#define POLYSHARD_SHARED(type, name, ...)    \
  static thread_local type name __VA_ARGS__; \
  ::polyshard::emulation::poison_static_shared(&name, sizeof(name))

#undef __launch_bounds__
#define __launch_bounds__(...)

/// `extern __shared__ type name[]`, the block's dynamic shared memory (the launch's shared-bytes
/// argument). The emulation's buffer is 128-byte aligned and filled with 0xFF bytes at every
/// block's start, so a value read before it was written is NaN.
#define POLYSHARD_DYNAMIC_SHARED(type, name) \
  type* const name = static_cast<type*>(::polyshard::emulation::dynamic_shared_memory())

// ---- built-in variables ------------------------------------------------------------------------

#define threadIdx (::polyshard::emulation::thread_index())
#define blockIdx (::polyshard::emulation::block_index())
#define blockDim (::polyshard::emulation::block_dim())
#define gridDim (::polyshard::emulation::grid_dim())
// A constant, not a macro: a macro would also rewrite cudaDeviceProp::warpSize.
inline constexpr int warpSize = 32;

// ---- barriers ----------------------------------------------------------------------------------

inline void __syncthreads() { ::polyshard::emulation::sync_threads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::polyshard::emulation::sync_warp(mask); }
// Blocks of a grid run one after another and streams' grids on different OS threads: a fence is
// what orders memory between OS threads.
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- warp intrinsics ---------------------------------------------------------------------------

namespace polyshard::emulation::detail {

/// `width` of a shuffle: a power of two up to 32 (the programming guide leaves any other value
/// undefined; here it is a fault of the kernel).
inline unsigned shuffle_width(int width) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    throw DeviceFault{cudaErrorLaunchFailure,
                      "shuffle width " + std::to_string(width) + " is not a power of two in [1, 32]"};
  return static_cast<unsigned>(width);
}

// The source lane of each shuffle, from the CUDA programming guide's description (warp shuffle
// functions): the warp is split into segments of `width` lanes; a lane reads within its segment
// (__shfl_xor_sync may also read an earlier segment) and gets its own value back where the source
// would fall outside.
inline int source_of_idx(unsigned lane, int src, unsigned width) {
  return static_cast<int>((lane & ~(width - 1)) + (static_cast<unsigned>(src) & (width - 1)));
}
inline int source_of_up(unsigned lane, unsigned delta, unsigned width) {
  return (lane & (width - 1)) >= delta ? static_cast<int>(lane - delta) : static_cast<int>(lane);
}
inline int source_of_down(unsigned lane, unsigned delta, unsigned width) {
  return std::uint64_t(lane & (width - 1)) + delta < width ? static_cast<int>(lane + delta) : static_cast<int>(lane);
}
inline int source_of_xor(unsigned lane, int lane_mask, unsigned width) {
  const int s = static_cast<int>(lane) ^ lane_mask;
  return s >= 0 && s < static_cast<int>((lane & ~(width - 1)) + width) ? s : static_cast<int>(lane);
}

template <class T>
T shuffle(unsigned mask, T var, int source) {
  // The bits travel, as on a GPU (__half2 has a user-written assignment, so it is not
  // trivially copyable, but its bits are all there is to it).
  static_assert(sizeof(T) <= 8 && std::is_standard_layout_v<T>, "a shuffle moves at most 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const void*>(&var), sizeof(T));
  bits = exchange_in_warp(mask, bits, source);
  T out;
  std::memcpy(static_cast<void*>(&out), &bits, sizeof(T));
  return out;
}

}  // namespace polyshard::emulation::detail

// Overloads for nvcc's types rather than one template, so that arguments convert as they do
// against nvcc's overloads (a short promotes to int, say).
#define POLYSHARD_EMULATION_SHUFFLES(T)                                                                               \
  inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {                                     \
    namespace d = ::polyshard::emulation::detail;                                                                     \
    return d::shuffle(mask, var,                                                                                      \
                      d::source_of_idx(::polyshard::emulation::lane_id(), srcLane, d::shuffle_width(width)));         \
  }                                                                                                                   \
  inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {                               \
    namespace d = ::polyshard::emulation::detail;                                                                     \
    return d::shuffle(mask, var, d::source_of_up(::polyshard::emulation::lane_id(), delta, d::shuffle_width(width))); \
  }                                                                                                                   \
  inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {                             \
    namespace d = ::polyshard::emulation::detail;                                                                     \
    return d::shuffle(mask, var,                                                                                      \
                      d::source_of_down(::polyshard::emulation::lane_id(), delta, d::shuffle_width(width)));          \
  }                                                                                                                   \
  inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {                                \
    namespace d = ::polyshard::emulation::detail;                                                                     \
    return d::shuffle(mask, var,                                                                                      \
                      d::source_of_xor(::polyshard::emulation::lane_id(), laneMask, d::shuffle_width(width)));        \
  }
POLYSHARD_EMULATION_SHUFFLES(int)
POLYSHARD_EMULATION_SHUFFLES(unsigned int)
POLYSHARD_EMULATION_SHUFFLES(long)
POLYSHARD_EMULATION_SHUFFLES(unsigned long)
POLYSHARD_EMULATION_SHUFFLES(long long)
POLYSHARD_EMULATION_SHUFFLES(unsigned long long)
POLYSHARD_EMULATION_SHUFFLES(float)
POLYSHARD_EMULATION_SHUFFLES(double)
POLYSHARD_EMULATION_SHUFFLES(__half)
POLYSHARD_EMULATION_SHUFFLES(__half2)
POLYSHARD_EMULATION_SHUFFLES(__nv_bfloat16)
POLYSHARD_EMULATION_SHUFFLES(__nv_bfloat162)
#undef POLYSHARD_EMULATION_SHUFFLES

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::polyshard::emulation::ballot_in_warp(mask, predicate != 0);
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) == mask; }

// ---- atomics -----------------------------------------------------------------------------------
// Blocks of one grid run on one OS thread, but grids of different streams run on different OS
// threads at once, so every atomic is a real one. Relaxed, as CUDA's atomic functions are. The
// overloads are exactly CUDA 13's for these types (no atomicMax on float, no atomicExch on double),
// so what compiles here compiles under nvcc.

namespace polyshard::emulation::detail {
template <class T>
std::atomic_ref<T> atomic(T* address) {
  return std::atomic_ref<T>(*address);
}
}  // namespace polyshard::emulation::detail

#define POLYSHARD_EMULATION_ATOMIC_ADD(T)                                                             \
  inline T atomicAdd(T* address, T val) {                                                             \
    return ::polyshard::emulation::detail::atomic(address).fetch_add(val, std::memory_order_relaxed); \
  }
#define POLYSHARD_EMULATION_ATOMIC_EXCH(T)                                                           \
  inline T atomicExch(T* address, T val) {                                                           \
    return ::polyshard::emulation::detail::atomic(address).exchange(val, std::memory_order_relaxed); \
  }
#define POLYSHARD_EMULATION_ATOMIC_CAS(T)                                                                             \
  inline T atomicCAS(T* address, T compare, T val) {                                                                  \
    ::polyshard::emulation::detail::atomic(address).compare_exchange_strong(compare, val, std::memory_order_relaxed); \
    return compare; /* the old value, whether or not it was replaced */                                               \
  }
#define POLYSHARD_EMULATION_ATOMIC_MINMAX(T)                                             \
  inline T atomicMax(T* address, T val) {                                                \
    auto a = ::polyshard::emulation::detail::atomic(address);                            \
    T old = a.load(std::memory_order_relaxed);                                           \
    while (old < val && !a.compare_exchange_weak(old, val, std::memory_order_relaxed)) { \
    }                                                                                    \
    return old;                                                                          \
  }                                                                                      \
  inline T atomicMin(T* address, T val) {                                                \
    auto a = ::polyshard::emulation::detail::atomic(address);                            \
    T old = a.load(std::memory_order_relaxed);                                           \
    while (val < old && !a.compare_exchange_weak(old, val, std::memory_order_relaxed)) { \
    }                                                                                    \
    return old;                                                                          \
  }
POLYSHARD_EMULATION_ATOMIC_ADD(int)
POLYSHARD_EMULATION_ATOMIC_ADD(unsigned int)
POLYSHARD_EMULATION_ATOMIC_ADD(unsigned long long)
POLYSHARD_EMULATION_ATOMIC_ADD(float)
POLYSHARD_EMULATION_ATOMIC_ADD(double)
POLYSHARD_EMULATION_ATOMIC_EXCH(int)
POLYSHARD_EMULATION_ATOMIC_EXCH(unsigned int)
POLYSHARD_EMULATION_ATOMIC_EXCH(unsigned long long)
POLYSHARD_EMULATION_ATOMIC_EXCH(float)
POLYSHARD_EMULATION_ATOMIC_CAS(int)
POLYSHARD_EMULATION_ATOMIC_CAS(unsigned int)
POLYSHARD_EMULATION_ATOMIC_CAS(unsigned long long)
POLYSHARD_EMULATION_ATOMIC_CAS(unsigned short)
POLYSHARD_EMULATION_ATOMIC_MINMAX(int)
POLYSHARD_EMULATION_ATOMIC_MINMAX(unsigned int)
POLYSHARD_EMULATION_ATOMIC_MINMAX(long long)
POLYSHARD_EMULATION_ATOMIC_MINMAX(unsigned long long)
#undef POLYSHARD_EMULATION_ATOMIC_ADD
#undef POLYSHARD_EMULATION_ATOMIC_EXCH
#undef POLYSHARD_EMULATION_ATOMIC_CAS
#undef POLYSHARD_EMULATION_ATOMIC_MINMAX

// ---- rounding intrinsics -----------------------------------------------------------------------
// nvcc never contracts __fadd_rn, __fmul_rn and the others into an FMA; g++ may contract a plain
// a * b + c (with -mfma / -march=native under -ffp-contract=fast, its default). An empty asm that
// claims to change each operand and result hides them from the contraction (and from any
// reassociation), whatever the flags, at the price of keeping them in registers.

namespace polyshard::emulation::detail {
template <class T>
inline T opaque(T v) {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(v));
#elif defined(__aarch64__)
  asm("" : "+w"(v));
#else
  volatile T keep = v;  // no register constraint known: a round trip through memory
  v = keep;
#endif
  return v;
}
}  // namespace polyshard::emulation::detail

inline float __fadd_rn(float a, float b) {
  using ::polyshard::emulation::detail::opaque;
  return opaque(opaque(a) + opaque(b));
}
inline float __fsub_rn(float a, float b) {
  using ::polyshard::emulation::detail::opaque;
  return opaque(opaque(a) - opaque(b));
}
inline float __fmul_rn(float a, float b) {
  using ::polyshard::emulation::detail::opaque;
  return opaque(opaque(a) * opaque(b));
}
inline float __fdiv_rn(float a, float b) {
  using ::polyshard::emulation::detail::opaque;
  return opaque(opaque(a) / opaque(b));
}
inline float __fsqrt_rn(float a) {
  using ::polyshard::emulation::detail::opaque;
  return opaque(std::sqrt(opaque(a)));  // IEEE square root: correctly rounded
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }  // one rounding
inline double __dadd_rn(double a, double b) {
  using ::polyshard::emulation::detail::opaque;
  return opaque(opaque(a) + opaque(b));
}
inline double __dsub_rn(double a, double b) {
  using ::polyshard::emulation::detail::opaque;
  return opaque(opaque(a) - opaque(b));
}
inline double __dmul_rn(double a, double b) {
  using ::polyshard::emulation::detail::opaque;
  return opaque(opaque(a) * opaque(b));
}
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }

// ---- reinterpretation --------------------------------------------------------------------------

inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }

// ---- cache-hinted loads and stores -------------------------------------------------------------
// The hints choose caches on a GPU; here each is a plain load or store.

template <class T>
inline T __ldg(const T* p) {
  return *p;
}
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}
template <class T>
inline T __ldca(const T* p) {
  return *p;
}
template <class T>
inline T __ldcs(const T* p) {
  return *p;
}
template <class T>
inline T __ldlu(const T* p) {
  return *p;
}
template <class T>
inline T __ldcv(const T* p) {
  return *p;
}
template <class T>
inline void __stwb(T* p, T value) {
  *p = value;
}
template <class T>
inline void __stcg(T* p, T value) {
  *p = value;
}
template <class T>
inline void __stcs(T* p, T value) {
  *p = value;
}
template <class T>
inline void __stwt(T* p, T value) {
  *p = value;
}

// ---- the launcher ------------------------------------------------------------------------------

namespace polyshard::emulation {
namespace detail {

template <class F>
struct kernel_signature {
  static_assert(sizeof(F) == 0, "launch<K>: K must be a kernel, a function returning void");
};
template <class... P>
struct kernel_signature<void (*)(P...)> {
  using params = std::tuple<std::decay_t<P>...>;  // what <<<>>> copies into the launch
};
template <class... P>
struct kernel_signature<void (*)(P...) noexcept> : kernel_signature<void (*)(P...)> {};

/// "polyshard::cuda::{anonymous}::fill_kernel<float>" from g++'s __PRETTY_FUNCTION__ of
/// kernel_name<K>() ("... [with auto K = <the kernel>; ...]"), without the namespaces every
/// kernel shares.
inline std::string kernel_name_from(std::string_view pretty) {
  const std::string_view key = "K = ";
  std::size_t begin = pretty.find(key);
  if (begin == std::string_view::npos) return std::string(pretty);
  begin += key.size();
  // The name ends at the ';' or ']' that closes the "[with ...]" list, outside any brackets of
  // its own template arguments.
  std::size_t end = begin;
  for (int depth = 0; end < pretty.size(); ++end) {
    const char c = pretty[end];
    if (depth == 0 && (c == ';' || c == ']')) break;
    if (c == '<' || c == '(' || c == '[' || c == '{') ++depth;
    if (c == '>' || c == ')' || c == ']' || c == '}') --depth;
  }
  std::string name(pretty.substr(begin, end - begin));
  if (!name.empty() && name.front() == '&') name.erase(0, 1);
  for (std::string_view noise : {"{anonymous}::", "(anonymous namespace)::"})
    for (std::size_t at; (at = name.find(noise)) != std::string::npos;) name.erase(at, noise.size());
  if (const std::string_view common = "polyshard::cuda::"; name.starts_with(common)) name.erase(0, common.size());
  return name;
}

/// Copy-initialises a parameter from an argument, as a call does (implicit conversions only).
template <class To>
To as_parameter(To value) {
  return value;
}

template <class T>
constexpr bool is_data_pointer = std::is_pointer_v<T>&& std::is_object_v<std::remove_pointer_t<T>>;

/// False (and the launch error reported) when parameter `index` points into the memory of
/// another device than the launch's. Null and unknown pointers pass: a kernel may be handed a
/// host pointer it never dereferences, or memory the emulation does not track; only another
/// emulated device's memory is certainly wrong.
inline bool pointer_on_device(std::string_view kernel, std::size_t index, const void* p, int device) {
  if (p == nullptr) return true;
  const PointerInfo info = find_pointer(p);
  if (info.kind != MemoryKind::device || info.device == device) return true;
  report_launch_error(cudaErrorInvalidValue,
                      "kernel " + std::string(kernel) + ": parameter " + std::to_string(index + 1) +
                          " points into device " + std::to_string(info.device) +
                          "'s memory, but the launch runs on device " + std::to_string(device) + "'s stream");
  return false;
}

template <class Params, std::size_t... I>
bool pointers_on_device(std::string_view kernel, const Params& params, cudaStream_t stream, std::index_sequence<I...>) {
  if constexpr ((is_data_pointer<std::tuple_element_t<I, Params>> || ...)) {
    const int device = stream_device(stream);
    bool ok = true;
    (
        [&] {
          if constexpr (is_data_pointer<std::tuple_element_t<I, Params>>)
            ok = ok && pointer_on_device(
                           kernel, I, const_cast<const void*>(static_cast<const volatile void*>(std::get<I>(params))),
                           device);
        }(),
        ...);
    return ok;
  } else {
    (void)kernel, (void)params, (void)stream;
    return true;
  }
}

template <class Params, std::size_t... I, class... Args>
Params to_parameters(std::index_sequence<I...>, Args&&... args) {
  return Params(as_parameter<std::tuple_element_t<I, Params>>(std::forward<Args>(args))...);
}

}  // namespace detail

/// The kernel's name for messages, from its template argument: "fill_kernel<float>".
template <auto K>
std::string_view kernel_name() {
  static const std::string name = detail::kernel_name_from(__PRETTY_FUNCTION__);
  return name;
}

/// kernel<<<grid, block, shared_bytes, stream>>>(args...): checks the configuration and the
/// pointer arguments (a refused launch is reported as cudaGetLastError() would see it), then
/// enqueues the grid on `stream`. The arguments are converted to the kernel's parameter types and
/// copied, as <<<>>> does, so the caller's variables may change or die after the call.
template <auto Kernel, class... Args>
void launch(dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  using Params = typename detail::kernel_signature<decltype(Kernel)>::params;
  static_assert(sizeof...(Args) == std::tuple_size_v<Params>,
                "launch<kernel>(grid, block, shared, stream, args...): one argument per kernel parameter");
  using Indices = std::make_index_sequence<sizeof...(Args)>;
  const std::string_view name = kernel_name<Kernel>();
  const LaunchShape shape{grid, block, shared_bytes, dynamic_shared_limit(reinterpret_cast<const void*>(Kernel))};
  if (std::string why = check_launch_shape(shape); !why.empty()) {
    report_launch_error(cudaErrorInvalidConfiguration, "kernel " + std::string(name) + ": " + why);
    return;
  }
  Params params = detail::to_parameters<Params>(Indices{}, std::forward<Args>(args)...);
  if (!detail::pointers_on_device(name, params, stream, Indices{})) return;
  enqueue(stream, "kernel " + std::string(name), [name, shape, params] {
    // Each thread gets its own copy of the parameters, as on a GPU.
    run_grid(name, shape, [&params] { std::apply(Kernel, params); });
  });
}

}  // namespace polyshard::emulation
