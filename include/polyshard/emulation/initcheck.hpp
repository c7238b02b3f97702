// initcheck on the emulated device: which bytes of each device allocation have been written, and a
// report naming the kernel, block and thread when a kernel reads one that was not, as
// compute-sanitizer's initcheck does on a GPU. A read of unwritten memory computes on garbage
// there; here the poison (0xFF) shows only where the value reaches a result, and a 16-byte load
// whose unused lanes are unwritten shows nowhere.
//
// The polyshard_cuda_emulation_initcheck library compiles the kernels with GCC's outline
// instrumentation of every load and store (-fsanitize=kernel-address with calls at every
// access), whose callbacks this library defines: a store marks its bytes written, a load of a
// byte still unwritten reports and aborts. The runtime marks what it writes outside kernels
// (copies, sets, the emulated NCCL's, cuBLASLt's and the sort's outputs). The shadow is one bit
// per byte, in a reserved region of address space that only touched pages occupy. In any other
// build of the emulation these functions do nothing.
#pragma once

#include <cstddef>

namespace polyshard::emulation::initcheck {

/// Whether this build of the emulation tracks writes (polyshard_cuda_emulation_initcheck).
bool enabled();

/// A device allocation of `bytes` at `p`: every byte unwritten.
void allocated(const void* p, std::size_t bytes);
/// Freed: no longer tracked.
void released(const void* p, std::size_t bytes);
/// Written outside a kernel (a copy, a set, a library call): readable.
void written(const void* p, std::size_t bytes);
/// How many of [p, p + bytes) are tracked and unwritten (for the tests).
std::size_t unwritten_bytes(const void* p, std::size_t bytes);

}  // namespace polyshard::emulation::initcheck
