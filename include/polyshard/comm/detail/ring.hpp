// Internals the backends share: call descriptions, error messages, ring chunking and the
// element kernels that reduce in the compute type.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "polyshard/comm/call_site.hpp"
#include "polyshard/comm/reduce_op.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"

namespace polyshard::detail::comm {

/// What a rank asked for, as compared across ranks to detect mismatched calls.
struct CallDesc {
  CollectiveKind kind = CollectiveKind::Barrier;
  DType dtype = DType::F32;
  std::uint64_t count = 0;  // elements of the input buffer
  int root = -1;
  ReduceOp op = ReduceOp::Sum;
  /// The caller's CallSite when the call was issued ("" when none).
  std::string site = CallSite::current();

  bool same_call(const CallDesc& o) const {
    return kind == o.kind && dtype == o.dtype && count == o.count && root == o.root && op == o.op && site == o.site;
  }
};

/// FNV-1a of a call site's text: what a backend that compares calls over the network sends in
/// place of the text (which it exchanges only when the hashes differ).
inline std::uint64_t site_hash(const std::string& text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

inline bool reduces(CollectiveKind kind) {
  return kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter || kind == CollectiveKind::Reduce;
}

/// "all_reduce(F32, 10 elements, sum)", "broadcast(F16, 3 elements, root 1)", "barrier()", then
/// " from SITE" when the call was issued under a CallSite.
inline std::string describe(const CallDesc& d) {
  std::ostringstream out;
  out << collective_name(d.kind) << '(';
  if (d.kind != CollectiveKind::Barrier && d.kind != CollectiveKind::Split) {
    out << dtype_name(d.dtype) << ", " << d.count << (d.count == 1 ? " element" : " elements");
    if (d.root >= 0) out << ", root " << d.root;
    if (reduces(d.kind)) out << ", " << reduce_op_name(d.op);
  }
  out << ')';
  if (!d.site.empty()) out << " from " << d.site;
  return out.str();
}

/// "rank 0", "ranks 0, 2".
inline std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

inline std::string seconds_text(std::chrono::milliseconds t) {
  std::ostringstream out;
  out << static_cast<double>(t.count()) / 1000.0 << " s";
  return out.str();
}

/// The half-open element range of chunk `c` when `n` elements are cut into `parts` chunks whose
/// sizes differ by at most one (and are equal when parts divides n).
struct Chunks {
  std::uint64_t n;
  int parts;
  std::uint64_t begin(int c) const { return n * static_cast<std::uint64_t>(c) / static_cast<std::uint64_t>(parts); }
  std::uint64_t end(int c) const { return begin(c + 1); }
  std::uint64_t size(int c) const { return end(c) - begin(c); }
};

/// (a mod n) for a possibly negative a.
inline int wrap(int a, int n) { return ((a % n) + n) % n; }

/// out[i] = C(in[i]) (or in[i] / divisor) converted to Out.
template <class C, class Out, class In>
void convert(Out* out, const In* in, std::uint64_t n, int divisor = 1) {
  if (divisor == 1) {
    if constexpr (std::is_same_v<Out, In>) {
      if (n) std::memcpy(out, in, n * sizeof(In));
    } else {
      for (std::uint64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(static_cast<C>(in[i]));
    }
  } else {
    const C d = static_cast<C>(divisor);
    for (std::uint64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(static_cast<C>(static_cast<C>(in[i]) / d));
  }
}

/// acc[i] += C(in[i]).
template <class C, class In>
void accumulate(C* acc, const In* in, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) acc[i] = acc[i] + static_cast<C>(in[i]);
}

/// out[i] = parts[0][i] + parts[1][i] + ... + parts[N-1][i], added left to right in the compute
/// type C, then divided by `divisor` when it is not 1. Every backend reduces each element in
/// this order, whatever the buffer's length and wherever the element lies in it, so a result
/// does not depend on how a caller cuts its buffers into collectives (buckets, units). `out`
/// may be one of the parts: each block is read whole before it is written.
template <class C, class T>
void sum_in_rank_order(T* out, const T* const* parts, int N, std::uint64_t n, int divisor) {
  constexpr std::uint64_t block = 2048;
  C sum[block];
  for (std::uint64_t b = 0; b < n; b += block) {
    const std::uint64_t len = std::min(block, n - b);
    convert<C>(sum, parts[0] + b, len);
    for (int q = 1; q < N; ++q) accumulate<C>(sum, parts[q] + b, len);
    convert<C>(out + b, sum, len, divisor);
  }
}

/// Checks shared by every backend before a collective runs (local mistakes, not mismatches).
inline void check_root(CollectiveKind kind, int root, int size, int rank) {
  POLYSHARD_CHECK(root >= 0 && root < size, "polyshard: ", collective_name(kind), " on rank ", rank, " of ", size,
                  ": root ", root, " is not a rank of the communicator");
}
inline void check_multiple(CollectiveKind kind, std::uint64_t big, std::uint64_t small, int size, int rank,
                           const char* big_name, const char* small_name) {
  POLYSHARD_CHECK(big == small * static_cast<std::uint64_t>(size), "polyshard: ", collective_name(kind), " on rank ",
                  rank, " of ", size, ": ", big_name, " has ", big, " elements but must have size() x ", small_name,
                  " = ", size, " x ", small, " = ", small * static_cast<std::uint64_t>(size));
}

}  // namespace polyshard::detail::comm
