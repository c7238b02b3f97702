// Every differentiable op: include this for all of them, or the one header of the op you need.
#pragma once

#include "polyshard/autograd/ops/accumulate.hpp"
#include "polyshard/autograd/ops/attention.hpp"
#include "polyshard/autograd/ops/cross_entropy.hpp"
#include "polyshard/autograd/ops/elementwise.hpp"
#include "polyshard/autograd/ops/embedding.hpp"
#include "polyshard/autograd/ops/gelu.hpp"
#include "polyshard/autograd/ops/gelu_mlp.hpp"
#include "polyshard/autograd/ops/grouped_qkv.hpp"
#include "polyshard/autograd/ops/layer_norm.hpp"
#include "polyshard/autograd/ops/linear.hpp"
#include "polyshard/autograd/ops/reduce.hpp"
#include "polyshard/autograd/ops/reshape.hpp"
#include "polyshard/autograd/ops/rms_norm.hpp"
#include "polyshard/autograd/ops/rope.hpp"
#include "polyshard/autograd/ops/silu.hpp"
#include "polyshard/autograd/ops/softmax.hpp"
