// The emulated NCCL's traffic, for a program that wants to count it. A real NCCL's transfers are
// invisible to its caller; the emulation knows what each rank's result took from other ranks'
// memory, and keeps that count per collective until the program takes it.
//
// The function is a weak symbol: a program linked against the real NCCL sees its address as null
// (and counts nothing), one linked against the emulation (polyshard_cuda_emulation) calls it. The
// same object code serves both, as every emulated twin requires.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace polyshard::emulation {

/// One finished collective of a rank: its number among the collectives this rank issued on the
/// communicator (from 0, in issue order, whatever stream each went to), and the bytes of other
/// ranks' buffers that went into this rank's result. The emulation's rule, per rank, for a
/// buffer of n elements of T (all-gather: n sent; reduce-scatter: n received) on N ranks:
///   all-reduce, reduce-scatter, all-gather   (N-1) n T: every other rank's contribution
///   broadcast                                 n T, and 0 at the root
///   reduce                                    (N-1) n T at the root, 0 elsewhere
/// A ring moves 2 (N-1)/N n T per rank for an all-reduce instead: the emulation computes every
/// rank's result from every rank's buffers, so its count is its own, not a ring's.
struct NcclTraffic {
  std::uint64_t call = 0;
  std::size_t bytes = 0;
};

/// Appends to `out` the traffic of `comm`'s collectives that finished since the last call, and
/// forgets it; ncclInvalidArgument if `comm` is not a live communicator. Weak: null unless the
/// program is linked against the emulation.
[[gnu::weak]] ncclResult_t take_nccl_traffic(ncclComm_t comm, std::vector<NcclTraffic>& out);

}  // namespace polyshard::emulation
