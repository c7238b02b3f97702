// The kernels a wrapped unit's flat storage needs on the GPU: packing its parameter tensors into
// one flat buffer and back, casting between master and compute types, unscaling gradients with
// the overflow check, and the partial sums of the gradient norm. Plain C++ (no Eigen): the
// launchers' definitions live in unit_kernels.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "polyshard/core/element_fwd.hpp"
#include "polyshard/core/error.hpp"

namespace polyshard::cuda {

/// One tensor's place in a unit's flat buffer: elements [offset, offset + numel) of the flat
/// buffer are the tensor's elements [0, numel). A table of these lives in device memory.
template <class T>
struct UnitEntry {
  T* tensor = nullptr;      // (numel,) the tensor's own device memory
  std::size_t offset = 0;   // index in the flat buffer of the tensor's first element
  std::size_t numel = 0;
};

/// Checks a unit table on the host before it is copied to the device: every entry lies inside
/// a flat buffer of `flat_numel` elements, has a tensor when it has elements, and no two entries
/// overlap in the flat buffer. Returns the sum of the entries' numel (what pack_unit and
/// unpack_unit take as `total_numel`). Throws polyshard::Error naming `who` and the entry.
template <class T>
std::size_t validate_unit_table(std::span<const UnitEntry<T>> table, std::size_t flat_numel,
                                const char* who = "unit table") {
  std::vector<std::size_t> order;  // the entries with elements, sorted by offset below
  std::size_t total = 0;
  for (std::size_t e = 0; e < table.size(); ++e) {
    const UnitEntry<T>& x = table[e];
    POLYSHARD_CHECK(x.offset <= flat_numel && x.numel <= flat_numel - x.offset, who, ": entry ", e, " (offset ",
                    x.offset, ", numel ", x.numel, ") ends past the flat buffer of ", flat_numel, " elements");
    POLYSHARD_CHECK(x.tensor != nullptr || x.numel == 0, who, ": entry ", e, " has ", x.numel,
                    " elements and no tensor");
    if (x.numel > 0) order.push_back(e);
    total += x.numel;
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return table[a].offset < table[b].offset; });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const UnitEntry<T>& prev = table[order[k - 1]];
    const UnitEntry<T>& next = table[order[k]];
    POLYSHARD_CHECK(prev.offset + prev.numel <= next.offset, who, ": entry ",
                    order[k - 1], " (offset ", prev.offset, ", numel ", prev.numel, ") overlaps entry ", order[k],
                    " (offset ", next.offset, ")");
  }
  return total;
}

/// Copies every tensor of a unit into its flat buffer, in one launch whatever the number of
/// tensors (the blocks walk the table): flat[e.offset + i] = e.tensor[i] for every entry e and
/// i < e.numel. Flat elements no entry covers are not written.
///   table        (entries,) device memory: the entries, within the flat buffer and not
///                overlapping there (validate_unit_table checks a host copy);
///   entries      number of entries; 0 launches nothing;
///   total_numel  sum of the entries' numel: sizes the grid only (any value gives the same result);
///   flat         the unit's flat buffer, device memory, overlapping no tensor (the tensors
///                are read through the read-only cache while flat is written);
///   stream       the stream the kernel runs in.
/// T: float, half or bfloat16. Any alignment (an entry whose source and destination are both
/// 16-byte aligned is copied in 128-bit packs). Throws polyshard::Error when table or flat is null
/// with entries > 0.
template <class T>
void pack_unit(const UnitEntry<T>* table, std::size_t entries, std::size_t total_numel, T* flat, cudaStream_t stream);

/// The inverse of pack_unit, in one launch: e.tensor[i] = flat[e.offset + i] for every entry e
/// and i < e.numel. Arguments as for pack_unit; the tensors must not overlap each other or flat.
template <class T>
void unpack_unit(const UnitEntry<T>* table, std::size_t entries, std::size_t total_numel, const T* flat,
                 cudaStream_t stream);

/// dst[i] = src[i] converted to To, rounded to nearest even (as Eigen's conversion rounds), for
/// i < numel; a plain copy when From is To.
///   src     (numel,) device memory of From (float, half or bfloat16);
///   dst     (numel,) device memory of To, not overlapping src;
///   numel   elements; 0 launches nothing;
///   stream  the stream the kernel runs in.
/// Pairs: float <-> bfloat16, float <-> half, and each type to itself. Any alignment (16-byte
/// aligned arrays take 128-bit loads and stores). Throws polyshard::Error when an array is null
/// with numel > 0.
template <class From, class To>
void cast_span(const From* src, To* dst, std::size_t numel, cudaStream_t stream);

/// Unscales gradients in place and checks them for overflow in the same pass:
/// grad[i] = grad[i] * inv_scale (in float, rounded back to G), and *found_nonfinite = 1 when any
/// element is inf or NaN before or after. The flag is only ever set, never cleared: zero it
/// before the first of several spans and read it after the last.
///   grad             (numel,) device memory of G (float, half or bfloat16), updated in place;
///   numel            elements; 0 launches nothing;
///   inv_scale        1 / loss_scale (finite);
///   found_nonfinite  one device int;
///   stream           the stream the kernel runs in.
/// Throws polyshard::Error when inv_scale is not finite or a pointer is null with numel > 0.
template <class G>
void unscale_and_check(G* grad, std::size_t numel, float inv_scale, int* found_nonfinite, cudaStream_t stream);

/// The number of blocks of every squared_norm_partials launch, hence of partial sums: fixed, so
/// that the order of the summation, and the result's bits, do not depend on the span's size.
inline constexpr unsigned squared_norm_blocks = 1024;

/// Sum of squares of a gradient span, in float, one partial sum per block:
/// partials[b] = (accumulate ? partials[b] : 0) + sum of grad[i]^2 over the elements block b
/// takes. Call with accumulate = false for the first of several spans and true for the others,
/// then squared_norm_finish once: the result is deterministic (no atomics; fixed blocks and order).
///   grad        (numel,) device memory of G (float, half or bfloat16); any alignment;
///   numel       elements; 0 is allowed (adds nothing; still writes the partials when
///               accumulate is false);
///   partials    (squared_norm_blocks,) device floats;
///   accumulate  add to the partials instead of overwriting them;
///   stream      the stream the kernel runs in.
/// Throws polyshard::Error when a pointer is null (grad only when numel > 0).
template <class G>
void squared_norm_partials(const G* grad, std::size_t numel, float* partials, bool accumulate, cudaStream_t stream);

/// Sums the squared_norm_blocks partial sums in a fixed order (in double, rounded once to float):
/// *out = (accumulate ? *out : 0) + sum of partials[0 .. squared_norm_blocks).
///   partials    (squared_norm_blocks,) device floats written by squared_norm_partials;
///   out         one device float; the squared norm (take its root on the host);
///   accumulate  add to *out instead of overwriting it;
///   stream      the stream the kernel runs in.
/// Throws polyshard::Error when a pointer is null.
void squared_norm_finish(const float* partials, float* out, bool accumulate, cudaStream_t stream);

}  // namespace polyshard::cuda
