// Umbrella header of the policy layer.
#pragma once

#include "polyshard/policy/accounting.hpp"
#include "polyshard/policy/config.hpp"
#include "polyshard/policy/defaults.hpp"
#include "polyshard/policy/family.hpp"
#include "polyshard/policy/offload.hpp"
#include "polyshard/policy/precision.hpp"
#include "polyshard/policy/presets.hpp"
#include "polyshard/policy/sharding.hpp"
#include "polyshard/policy/strategy.hpp"
#include "polyshard/policy/wrap.hpp"
