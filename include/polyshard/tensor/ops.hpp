// Every tensor kernel: include this for all ops, or the one header of the op you need.
#pragma once

#include "polyshard/tensor/ops/attention.hpp"
#include "polyshard/tensor/ops/cast.hpp"
#include "polyshard/tensor/ops/cross_entropy.hpp"
#include "polyshard/tensor/ops/elementwise.hpp"
#include "polyshard/tensor/ops/embedding.hpp"
#include "polyshard/tensor/ops/gelu.hpp"
#include "polyshard/tensor/ops/grad_out.hpp"
#include "polyshard/tensor/ops/grouped_qkv.hpp"
#include "polyshard/tensor/ops/layer_norm.hpp"
#include "polyshard/tensor/ops/linear.hpp"
#include "polyshard/tensor/ops/matmul.hpp"
#include "polyshard/tensor/ops/reduce.hpp"
#include "polyshard/tensor/ops/rms_norm.hpp"
#include "polyshard/tensor/ops/rope.hpp"
#include "polyshard/tensor/ops/silu.hpp"
#include "polyshard/tensor/ops/softmax.hpp"
