// ShardPartition::whole_parameters: FairScale's OSS partition of a model's parameters among the
// ranks, and the unit layout that puts each rank's parameters together in a shard of its own
// size, which the engine reduces to and broadcasts from its owner as OSS does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/engine/units.hpp"

namespace polyshard {

/// The rank a parameter of `numel` elements goes to: the rank holding the fewest elements so far
/// in `load` (one entry a rank; the lowest such rank on a tie), which then holds its elements
/// more, or one more for a frozen parameter (whose state is not partitioned, so that frozen ones
/// are spread rather than piled on one rank).
inline int assign_whole_parameter(std::int64_t numel, bool trainable, std::vector<std::int64_t>& load) {
  POLYSHARD_CHECK(!load.empty(), "assign_whole_parameter: no ranks to assign a parameter to");
  const auto least = std::min_element(load.begin(), load.end());  // the first of equal ones
  *least += trainable ? numel : 1;
  return static_cast<int>(least - load.begin());
}

/// assign_whole_parameter for each parameter, in the order given. `load` carries the tally from
/// one call to the next, as OSS's runs on from one parameter group to the next.
inline std::vector<int> assign_whole_parameters(const std::vector<std::int64_t>& numels,
                                                const std::vector<bool>& trainable, std::vector<std::int64_t>& load) {
  POLYSHARD_CHECK(!load.empty(), "assign_whole_parameters: no ranks to assign parameters to");
  POLYSHARD_CHECK(numels.size() == trainable.size(), "assign_whole_parameters: ", numels.size(),
                  " parameter sizes for ", trainable.size(), " trainable flags");
  std::vector<int> owners;
  owners.reserve(numels.size());
  for (std::size_t i = 0; i < numels.size(); ++i)
    owners.push_back(assign_whole_parameter(numels[i], trainable[i], load));
  return owners;
}

/// Lays `plan`'s units out for `world` ranks that each own whole parameters: the model's
/// parameters, in the order it declares them whatever their units, are assigned by
/// assign_whole_parameter with one tally per optimizer (UnitEntry::optimizer: each OSS of a
/// list partitions its own parameters), and each unit is cut into uneven shards
/// (UnitLayout::bounds), rank after rank, each holding its rank's parameters of the unit in that
/// order, with no padding anywhere. A unit's entries end in offset order. Trainability is read
/// now: the partition stays what it was when the engine was built.
template <FloatElement T, Device D>
void lay_out_whole_parameters(UnitPlan<T, D>& plan, int world) {
  POLYSHARD_CHECK(world >= 1, "lay_out_whole_parameters: a world of ", world, " ranks");
  // Every parameter as (unit, entry), in declaration order.
  std::vector<std::pair<std::size_t, std::size_t>> declared;
  for (std::size_t u = 0; u < plan.units.size(); ++u)
    for (std::size_t i = 0; i < plan.units[u].entries.size(); ++i) declared.emplace_back(u, i);
  const auto entry = [&plan](const std::pair<std::size_t, std::size_t>& at) -> auto& {
    return plan.units[at.first].entries[at.second];
  };
  std::sort(declared.begin(), declared.end(),
            [&](const auto& a, const auto& b) { return entry(a).order < entry(b).order; });
  std::vector<std::int64_t> numels;
  std::vector<int> owners;
  std::vector<std::vector<std::int64_t>> loads;  // one tally per optimizer
  for (const auto& at : declared) {
    const auto& e = entry(at);
    if (loads.size() <= e.optimizer) loads.resize(e.optimizer + 1, std::vector<std::int64_t>(world, 0));
    numels.push_back(e.numel());
    owners.push_back(assign_whole_parameter(e.numel(), e.parameter->requires_grad(), loads[e.optimizer]));
  }
  // Each unit's shards: rank r's starts where rank r - 1's ends.
  const std::size_t ranks = static_cast<std::size_t>(world);
  std::vector<std::int64_t> next(plan.units.size() * ranks, 0);  // per unit and rank: the next free element
  for (std::size_t k = 0; k < declared.size(); ++k)
    next[declared[k].first * ranks + static_cast<std::size_t>(owners[k])] += numels[k];
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    auto& unit = plan.units[u];
    unit.bounds.assign(ranks + 1, 0);
    for (std::size_t r = 0; r < ranks; ++r) {
      unit.bounds[r + 1] = unit.bounds[r] + next[u * ranks + r];  // + rank r's elements
      next[u * ranks + r] = unit.bounds[r];
    }
    unit.padded = unit.bounds.back();
  }
  for (std::size_t k = 0; k < declared.size(); ++k) {
    std::int64_t& at = next[declared[k].first * ranks + static_cast<std::size_t>(owners[k])];
    entry(declared[k]).offset = at;
    at += numels[k];
  }
  for (auto& unit : plan.units)
    std::stable_sort(unit.entries.begin(), unit.entries.end(),
                     [](const auto& a, const auto& b) { return a.offset < b.offset; });
}

}  // namespace polyshard
