// Every header the compile-failure cases include, precompiled once per build (tests/fail's
// CMakeLists.txt) and put before each case with -include: a case then costs its own templates,
// not a second of parsing the library: the suite's 53 compiler runs took 60 s instead of 100 (on a
// 2-core AMD EPYC, two at a time), the lattice's samples 22 s instead of 43.
// A case that defines or undefines a macro before its includes is compiled without it, since the
// library would already have been read with the macro as it was here (check_fail.cmake).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/engine/offload.hpp"
#include "polyshard/engine/sharded_construction.hpp"
#include "polyshard/nn/block.hpp"
#include "polyshard/nn/gpt.hpp"
#include "polyshard/nn/linear.hpp"
#include "polyshard/optim/adamw.hpp"
#include "polyshard/policy/policy.hpp"
#include "polyshard/policy/presets.hpp"
#include "polyshard/policy/strategy.hpp"
#include "support/policy_covering.hpp"
#include "support/policy_lattice.hpp"
