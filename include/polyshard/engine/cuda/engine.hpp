// The engine on CUDA devices: include this header (instead of polyshard/engine/engine.hpp) to
// train a device model (Gpt<CT, Cuda>) under any strategy, one GPU per rank over NCCL. It brings
// the device ops the tape calls, the device twins of the step's gradient arithmetic and the fused
// optimizers the engine steps units with.
#pragma once

#include "polyshard/comm/nccl_communicator.hpp"
#include "polyshard/core/cuda/device_handoff.hpp"
#include "polyshard/engine/cuda/gradient_ops.hpp"
#include "polyshard/optim/cuda/fused_optimizer.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/storage.hpp"
#include "polyshard/tensor/cuda/transfer.hpp"

#include "polyshard/engine/engine.hpp"
