// Umbrella header of the nn layer.
#pragma once

#include "polyshard/nn/block.hpp"
#include "polyshard/nn/causal_self_attention.hpp"
#include "polyshard/nn/embedding.hpp"
#include "polyshard/nn/flat_parameters.hpp"
#include "polyshard/nn/gelu.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/nn/init.hpp"
#include "polyshard/nn/layer_norm.hpp"
#include "polyshard/nn/linear.hpp"
#include "polyshard/nn/mlp.hpp"
#include "polyshard/nn/module_hooks.hpp"
#include "polyshard/nn/parameter.hpp"
#include "polyshard/nn/reflect.hpp"
