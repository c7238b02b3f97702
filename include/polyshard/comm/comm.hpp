// Umbrella header of the communication layer: the Communicator concept and its backends.
// The MPI and NCCL backends are included when their headers are on the include path (that is,
// when the target links MPI::MPI_CXX, or CUDA::cudart with NCCL installed beside it); include
// polyshard/comm/mpi_communicator.hpp or nccl_communicator.hpp directly to insist on one.
#pragma once

#include "polyshard/comm/call_site.hpp"
#include "polyshard/comm/comm_handle.hpp"
#include "polyshard/comm/comm_options.hpp"
#include "polyshard/comm/comm_stats.hpp"
#include "polyshard/comm/communicator.hpp"
#include "polyshard/comm/reduce_op.hpp"
#include "polyshard/comm/thread_communicator.hpp"

#if __has_include(<mpi.h>)
#include "polyshard/comm/mpi_communicator.hpp"
#endif

#if __has_include(<nccl.h>) && __has_include(<cuda_runtime_api.h>) && !defined(POLYSHARD_NO_NCCL)
#include "polyshard/comm/nccl_communicator.hpp"
#endif
