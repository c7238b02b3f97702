// The reduction operators and the collective kinds every communicator shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace polyshard {

/// How a reducing collective combines the ranks' buffers.
/// `Sum` adds them; `Avg` adds them and divides the sum by the number of ranks (in the compute
/// type: float for half and bfloat16).
enum class ReduceOp : std::uint8_t { Sum, Avg };

constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
  }
  return "?";
}

/// The collectives a communicator runs; CommStats counts per kind.
enum class CollectiveKind : std::uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, Barrier, Split };
inline constexpr std::size_t collective_kind_count = 7;

constexpr std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::Reduce: return "reduce";
    case CollectiveKind::Barrier: return "barrier";
    case CollectiveKind::Split: return "split";
  }
  return "?";
}

/// Bytes one rank sends in a collective under the ring algorithm, the figure CommStats counts
/// for every backend whatever algorithm it really runs, so that strategies can be checked
/// against a formula:
///   all_reduce             2 (N-1)/N x buffer
///   reduce_scatter         (N-1)/N x input buffer  (N x the output)
///   all_gather             (N-1)/N x output buffer (N x the input)
///   broadcast and reduce   1 x buffer (0 when N = 1: nothing leaves the rank)
///   barrier and split      0
/// The value is fractional when the buffer does not divide by N: it is then the ring's
/// average over the ranks.
constexpr double ring_bytes_sent(CollectiveKind kind, std::uint64_t buffer_bytes, int world_size) {
  const double bytes = static_cast<double>(buffer_bytes);
  const double n = static_cast<double>(world_size);
  if (world_size <= 1) return 0.0;
  switch (kind) {
    case CollectiveKind::AllReduce: return 2.0 * (n - 1.0) * bytes / n;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllGather: return (n - 1.0) * bytes / n;
    case CollectiveKind::Broadcast:
    case CollectiveKind::Reduce: return bytes;
    case CollectiveKind::Barrier:
    case CollectiveKind::Split: return 0.0;
  }
  return 0.0;
}

}  // namespace polyshard
