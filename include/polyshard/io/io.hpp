// Umbrella header of the io layer.
#pragma once

#include "polyshard/io/atomic_directory.hpp"
#include "polyshard/io/atomic_file.hpp"
#include "polyshard/io/checkpoint_io.hpp"
#include "polyshard/io/checkpoint_metadata.hpp"
#include "polyshard/io/deepspeed_config.hpp"
#include "polyshard/io/full_weights.hpp"
#include "polyshard/io/hf_gpt2.hpp"
#include "polyshard/io/json.hpp"
#include "polyshard/io/safetensors.hpp"
#include "polyshard/io/sharded_checkpoint.hpp"
#include "polyshard/io/state_dict.hpp"
#include "polyshard/io/tied_parameters.hpp"
