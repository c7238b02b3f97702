// One sharding family's engines (POLYSHARD_TRAIN_FAMILY names it): built once per family and
// device by CMakeLists.txt, so that each translation unit instantiates the family's six
// strategies (three precisions, two wraps) instead of one unit instantiating them all. On the
// host the ranks' communicator is an AnyCommunicator: threads and MPI processes share one
// instantiation of each engine.
#ifdef POLYSHARD_TRAIN_ON_CUDA
#include "polyshard/comm/nccl_communicator.hpp"
#include "polyshard/engine/cuda/engine.hpp"
#else
#include "polyshard/comm/any_communicator.hpp"
#endif
#include "trainer.hpp"

#ifndef POLYSHARD_TRAIN_FAMILY
#error "family.cpp is compiled once per family with POLYSHARD_TRAIN_FAMILY=<ddp|zero1|...>"
#endif

namespace train {

#ifdef POLYSHARD_TRAIN_ON_CUDA
template void train_family<Family::POLYSHARD_TRAIN_FAMILY, polyshard::Cuda>(const Options&, polyshard::NcclCommunicator&,
                                                                            const polyshard::TextDataset&, polyshard::Trace*);
#else
template void train_family<Family::POLYSHARD_TRAIN_FAMILY, polyshard::Cpu>(const Options&, polyshard::AnyCommunicator&,
                                                                           const polyshard::TextDataset&, polyshard::Trace*);
#endif

}  // namespace train
