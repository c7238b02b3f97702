// polyshard-train on GPUs: the entry point main() calls for --device cuda, defined in
// train_cuda.cpp where the build has CUDA and NCCL (the device engines are in strategies.cpp,
// built once per precision with POLYSHARD_TRAIN_ON_CUDA).
#pragma once

#include <functional>
#include <span>

#include "options.hpp"
#include "datasets.hpp"
#include "polyshard/profile/trace.hpp"

namespace train {

/// Trains under the options' strategy as rank `rank` of `world`, on CUDA device `device`, the
/// ranks joined by an NCCL communicator whose id rank 0 makes and `share` broadcasts from rank 0
/// over the launcher's communicator (the id's bytes, as floats).
void train_on_cuda(const Options& o, const Datasets& data, int rank, int world, int device,
                   const std::function<void(std::span<float>)>& share, polyshard::Trace* trace);

}  // namespace train
