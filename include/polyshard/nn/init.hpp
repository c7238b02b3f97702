// Deterministic initialisation: element i of a parameter is a pure function of (seed, the
// parameter's name, i), so any slice of any parameter can be initialised on its own -- a rank
// that builds only its shard gets the same values as a process that builds the whole model.
#pragma once

#include <span>
#include <string_view>

#include "polyshard/core/counter_rng.hpp"
#include "polyshard/nn/parameter.hpp"

namespace polyshard {

/// Writes elements [begin, begin + out.size()) of parameter `name` initialised by `init`.
template <class T>
void initialize_slice(std::span<T> out, std::int64_t begin, const ParameterInit& init, std::string_view name,
                      std::uint64_t seed) {
  switch (init.kind) {
    case ParameterInit::Kind::Zeros:
      for (T& x : out) x = T(0);
      break;
    case ParameterInit::Kind::Ones:
      for (T& x : out) x = T(1);
      break;
    case ParameterInit::Kind::Normal: {
      const std::uint64_t stream = splitmix64(seed) ^ name_hash(name);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = static_cast<T>(init.std * counter_normal(stream, static_cast<std::uint64_t>(begin) + i));
      break;
    }
  }
}

}  // namespace polyshard
