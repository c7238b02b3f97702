// The engines of one precision (POLYSHARD_TRAIN_PRECISION names it; POLYSHARD_TRAIN_FP16 is set
// beside fp16_mixed) for every sharding family and wrap: built once per precision and device by
// CMakeLists.txt. On the host the ranks' communicator is an AnyCommunicator: threads and MPI
// processes share one instantiation of each engine.
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
#define POLYSHARD_TRAIN_INSTANCE(family, precision)                                                                \
  template void train_strategy<Family::family, Precision::precision, polyshard::Cuda>(                             \
      const Options&, polyshard::NcclCommunicator&, const Datasets&, polyshard::Trace*);
#else
#define POLYSHARD_TRAIN_INSTANCE(family, precision)                                                                \
  template void train_strategy<Family::family, Precision::precision, polyshard::Cpu>(                              \
      const Options&, polyshard::AnyCommunicator&, const Datasets&, polyshard::Trace*);
#endif

#ifndef POLYSHARD_TRAIN_FP16
POLYSHARD_TRAIN_INSTANCE(ddp, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero1, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero2, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero3, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(fsdp_grad_op, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero1_offload, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero_offload, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero3_offload_optimizer, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero3_offload, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero3_offload_parameters, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(hybrid, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero_infinity, POLYSHARD_TRAIN_PRECISION)
POLYSHARD_TRAIN_INSTANCE(zero_infinity_parameters, POLYSHARD_TRAIN_PRECISION)
#else
// fp16-mixed scales as each name's reference does (families.hpp): DeepSpeed's scaler for the ZeRO
// families, PyTorch's GradScaler for those DDP, ShardedDDP, FSDP and the hybrid shard reach
// (zero2 and zero3 are both: sharded_ddp and fsdp name them too).
POLYSHARD_TRAIN_INSTANCE(zero1, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(zero2, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(zero3, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(zero1_offload, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(zero_offload, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(zero3_offload_optimizer, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(zero3_offload, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(zero3_offload_parameters, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(zero_infinity, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(zero_infinity_parameters, fp16_mixed)
POLYSHARD_TRAIN_INSTANCE(ddp, fp16_amp)
POLYSHARD_TRAIN_INSTANCE(zero2, fp16_amp)
POLYSHARD_TRAIN_INSTANCE(zero3, fp16_amp)
POLYSHARD_TRAIN_INSTANCE(fsdp_grad_op, fp16_amp)
POLYSHARD_TRAIN_INSTANCE(hybrid, fp16_amp)
#endif

}  // namespace train
