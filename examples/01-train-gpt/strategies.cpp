// The engines of one precision (POLYSHARD_TRAIN_PRECISION names it) for every sharding family and
// wrap: built once per precision and device by CMakeLists.txt. On the host the ranks'
// communicator is an AnyCommunicator: threads and MPI processes share one instantiation of each
// engine.
#ifdef POLYSHARD_TRAIN_ON_CUDA
#include "polyshard/comm/nccl_communicator.hpp"
#include "polyshard/engine/cuda/engine.hpp"
#else
#include "polyshard/comm/any_communicator.hpp"
#endif
#include "trainer.hpp"

#ifndef POLYSHARD_TRAIN_PRECISION
#error "strategies.cpp is compiled once per precision with POLYSHARD_TRAIN_PRECISION=<fp32|bf16_mixed|fp16_mixed>"
#endif

namespace train {

#ifdef POLYSHARD_TRAIN_ON_CUDA
#define POLYSHARD_TRAIN_INSTANCE(family)                                                                           \
  template void train_strategy<Family::family, Precision::POLYSHARD_TRAIN_PRECISION, polyshard::Cuda>(             \
      const Options&, polyshard::NcclCommunicator&, const Datasets&, polyshard::Trace*);
#else
#define POLYSHARD_TRAIN_INSTANCE(family)                                                                           \
  template void train_strategy<Family::family, Precision::POLYSHARD_TRAIN_PRECISION, polyshard::Cpu>(              \
      const Options&, polyshard::AnyCommunicator&, const Datasets&, polyshard::Trace*);
#endif

POLYSHARD_TRAIN_INSTANCE(ddp)
POLYSHARD_TRAIN_INSTANCE(zero1)
POLYSHARD_TRAIN_INSTANCE(zero2)
POLYSHARD_TRAIN_INSTANCE(zero3)
POLYSHARD_TRAIN_INSTANCE(fsdp_grad_op)
POLYSHARD_TRAIN_INSTANCE(zero1_offload)
POLYSHARD_TRAIN_INSTANCE(zero_offload)
POLYSHARD_TRAIN_INSTANCE(zero3_offload_optimizer)
POLYSHARD_TRAIN_INSTANCE(zero3_offload)
POLYSHARD_TRAIN_INSTANCE(zero3_offload_parameters)
POLYSHARD_TRAIN_INSTANCE(hybrid)
POLYSHARD_TRAIN_INSTANCE(zero_infinity)
POLYSHARD_TRAIN_INSTANCE(zero_infinity_parameters)

}  // namespace train
