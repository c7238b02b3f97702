// What an OffloadPolicy changes in this engine: one placement per kind of policy.
#pragma once

#include "polyshard/engine/offload/host.hpp"
#include "polyshard/engine/offload/nvme_optimizer_state.hpp"
#include "polyshard/engine/offload/nvme_parameters.hpp"
#include "polyshard/engine/offload/placement.hpp"
