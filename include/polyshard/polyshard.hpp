// Everything a training program uses, one include: tensors and their ops, autograd, modules,
// optimizers, data, communicators (MPI and NCCL where their headers are found, as
// comm/comm.hpp says), policies and strategies, the engine, checkpoints and weight files, and
// traces. Each layer's own header includes less, for translation units that want to compile
// faster.
#pragma once

#include "polyshard/core/device.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/core/memory_tracker.hpp"
#include "polyshard/tensor/tensor.hpp"
#include "polyshard/tensor/ops.hpp"
#include "polyshard/autograd/backward.hpp"
#include "polyshard/autograd/checkpoint.hpp"
#include "polyshard/autograd/grad_mode.hpp"
#include "polyshard/autograd/ops.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "polyshard/data/data.hpp"
#include "polyshard/comm/comm.hpp"
#include "polyshard/policy/policy.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/engine/generate.hpp"
#include "polyshard/io/io.hpp"
#include "polyshard/profile/trace.hpp"
