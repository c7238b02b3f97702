// The loop every optimizer kernel shares: one SIMD packet at a time, split across threads.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <span>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "polyshard/core/cpu_workers.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/optim/detail/exact_sqrt.hpp"

namespace polyshard {

/// Sets how many threads one optimizer kernel call, or one host cast between element types
/// (cast_into), may use: 0 (the default) lets the call choose (all hardware threads, for spans
/// large enough to pay for waking them), 1 keeps every call on the calling thread (what an engine
/// running one rank per thread wants). Results are the same bit for bit whatever the setting:
/// both are elementwise.
inline void set_optimizer_threads(unsigned threads);

/// The value set by set_optimizer_threads (0: automatic).
inline unsigned optimizer_threads();

namespace detail {

// The kernels are written on Eigen's packet primitives (the SIMD type Eigen picked for P on this
// target, or P itself when Eigen does not vectorize) rather than as a scalar loop: a loop calling
// std::sqrt does not vectorize unless the user compiles with -fno-math-errno, and a header cannot
// choose its users' flags. Where exact_sqrt.hpp has no sqrt for Eigen's packet (32-bit ARM,
// POWER, ...), the "packet" is P itself and the same code runs one element at a time.
template <class Packet>
concept HasExactSqrt = requires(Packet x) { exact_psqrt(x); };

template <class P>
using eigen_packet_t = typename Eigen::internal::packet_traits<P>::type;

// GCC warns that a packet's vector attributes are dropped when it is a template argument; Eigen
// silences the same warning in its own headers. Nothing here depends on those attributes.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
#endif
template <class P, bool = HasExactSqrt<eigen_packet_t<P>>>
struct packet_of {
  using type = P;
};
template <class P>
struct packet_of<P, true> {
  using type = eigen_packet_t<P>;
};

template <class P>
using packet_t = typename packet_of<P>::type;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

template <class P>
inline constexpr std::size_t packet_size_v = Eigen::internal::unpacket_traits<packet_t<P>>::size;

// Gradients of another type are converted in chunks of this many elements (L1-resident).
inline constexpr std::size_t convert_chunk = 1024;

template <class P>
struct alignas(64) PaddedPacket {
  P data[packet_size_v<P>] = {};
};

// One U for each element of a pack: std::tuple<repeat_t<T, U>...>.
template <class, class U>
using repeat_t = U;

/// Calls `body(arrays + i...)` for every whole packet in [0, n), each pointer addressing
/// packet_size_v<P> elements. The last, partial packet goes through the same body on zero-padded
/// copies, written back for the arrays that are not const: every element, wherever a span starts
/// or is cut, is computed by the same instructions, so updating a span in slices or across threads
/// gives the same bits as updating it whole (a scalar tail could round differently, for example
/// where the compiler contracts a multiply and an add into an FMA in one loop and not the other).
template <class P, class Body, class... T>
void for_each_packet(std::size_t n, Body&& body, T*... arrays) {
  static_assert((std::is_same_v<std::remove_const_t<T>, P> && ...), "for_each_packet: every array holds P");
  constexpr std::size_t lanes = packet_size_v<P>;
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) body((arrays + i)...);
  if (i == n) return;
  const std::size_t len = n - i;
  std::tuple<repeat_t<T, PaddedPacket<P>>...> pads;
  [&]<std::size_t... k>(std::index_sequence<k...>) {
    (std::copy_n(arrays + i, len, std::get<k>(pads).data), ...);
    body(std::get<k>(pads).data...);
    auto write_back = [&](auto* dst, const PaddedPacket<P>& src) {
      if constexpr (!std::is_const_v<std::remove_pointer_t<decltype(dst)>>) std::copy_n(src.data, len, dst + i);
    };
    (write_back(arrays, std::get<k>(pads)), ...);
  }(std::index_sequence_for<T...>{});
}

/// Runs `body(offset, count, g)` over [begin, end) in one or more pieces, where `g` points at the
/// gradients of elements [offset, offset + count) as P: `grad + offset` itself when G is P, else
/// a converted copy (element_cast, chunk by chunk).
template <class P, class G, class Body>
void with_grad_as(const G* grad, std::size_t begin, std::size_t end, Body&& body) {
  if constexpr (std::is_same_v<G, P>) {
    body(begin, end - begin, grad + begin);
  } else {
    alignas(64) P converted[convert_chunk];
    for (std::size_t i = begin; i < end; i += convert_chunk) {
      const std::size_t len = std::min(convert_chunk, end - i);
      for (std::size_t j = 0; j < len; ++j) converted[j] = element_cast<P>(grad[i + j]);
      body(i, len, static_cast<const P*>(converted));
    }
  }
}

/// 16-bit master weights and optimizer state (PureBf16): `update(begin, float spans...)` runs
/// the float kernel over each chunk of `spans` widened to float, and the results are rounded
/// back, once per value per step. An empty span (no momentum buffer) stays empty.
template <class P, class Update, class... Spans>
void update_widened(std::size_t n, Update&& update, Spans... spans) {
  constexpr std::size_t chunk = std::size_t{1} << 14;
  std::array<std::vector<float>, sizeof...(Spans)> wide;
  for (auto& w : wide) w.resize(std::min(n, chunk));
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t count = std::min(chunk, n - begin);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      const auto widen = [&](std::span<P> from, std::vector<float>& to) {
        if (!from.empty()) std::transform(from.begin() + begin, from.begin() + begin + count, to.begin(),
                                          [](P x) { return static_cast<float>(x); });
      };
      const auto narrow = [&](const std::vector<float>& from, std::span<P> to) {
        if (!to.empty()) std::transform(from.begin(), from.begin() + count, to.begin() + begin,
                                        [](float x) { return static_cast<P>(x); });
      };
      (widen(spans, wide[I]), ...);
      update(begin, std::span<float>(wide[I].data(), spans.empty() ? 0 : count)...);
      (narrow(wide[I], spans), ...);
    }(std::index_sequence_for<Spans...>{});
  }
}

}  // namespace detail

inline void set_optimizer_threads(unsigned threads) {
  detail::optimizer_threads_setting().store(threads, std::memory_order_relaxed);
}
inline unsigned optimizer_threads() { return detail::optimizer_threads_setting().load(std::memory_order_relaxed); }

}  // namespace polyshard
