// Umbrella header of the optimizers layer.
#pragma once

#include "polyshard/optim/adam.hpp"
#include "polyshard/optim/any_optimizer.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/optim/clip_grad_norm.hpp"
#include "polyshard/optim/config.hpp"
#include "polyshard/optim/optimizer.hpp"
#include "polyshard/optim/optimizer_list.hpp"
#include "polyshard/optim/sgd.hpp"
