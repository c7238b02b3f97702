// OffloadPlacement<Offload>: where an offload policy keeps each unit's optimizer state (and,
// offloading parameters to NVMe, its parameter shard) between uses, as one specialization per
// kind of policy (engine/offload/*.hpp).
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "polyshard/policy/offload.hpp"

namespace polyshard {

/// What the engine asks of a placement, as members of every specialization:
///   static constexpr const char* optimizer_state, parameters;  where they live between steps
///   place(unit, units, optimizers, config, rank)  as soon as unit `unit` and its optimizer
///                    (OptimizerGroups, one optimizer per sub-group) are built, each unit in turn:
///                    take its state where it lives between steps;
///   finish_placing() after the last unit's place();
///   fetch(unit)      before the unit's optimizer step: its parameter shard (where it is
///                    offloaded) resident, and the next unit's on its way;
///   fetch_group(unit, k)  before the step of the unit's sub-group k: its optimizer state (and
///                    the masters it holds) resident, and the next sub-group's on its way;
///   store_group(unit, k)  after that step: the sub-group's state on its way back;
///   store(unit)      after the step and the write-back of its parameters: its shard on its
///                    way back;
///   settle()         after the last unit: every unit's state back where it lives between steps;
///   with_resident(unit, fn)  fn() with the unit's state and parameter shard resident, then put
///                    back (checkpoints);
///   acquire_parameters(unit), release_parameters(unit)  around a read of the unit's parameter
///                    shard outside the step (a gather): resident from the first to the second;
///   may_read_parameters_ahead(unit)  whether a gather issued ahead of its unit (a prefetch) may
///                    bring the unit's shard in now;
///   read_parameters_ahead(unit)  start bringing in the shard of the unit whose gather comes
///                    after those issued, without waiting: acquire_parameters then waits only for
///                    what has not arrived;
///   with_parameters(unit, fn)  fn() with the unit's parameter shard resident, for reading;
///   with_masters(unit, fn)  fn() with the unit's master weights and parameter shard resident,
///                    both written back after (a refresh of the shard from the masters).
/// The parameter members of a placement whose parameter shards and master weights stay in memory:
/// nothing to bring in.
struct ParametersInMemory {
  template <class F>
  decltype(auto) with_masters(std::size_t, F&& fn) {
    return std::forward<F>(fn)();
  }
  void acquire_parameters(std::size_t) {}
  void release_parameters(std::size_t) {}
  bool may_read_parameters_ahead(std::size_t) const { return true; }
  void read_parameters_ahead(std::size_t) {}
  template <class F>
  decltype(auto) with_parameters(std::size_t, F&& fn) {
    return std::forward<F>(fn)();
  }
};

namespace detail {
/// fn()'s result, with put_back() run after it (what fn used written back); if either throws,
/// abandon() runs before the exception goes on (what was brought in freed, unwritten).
template <class F, class PutBack, class Abandon>
std::invoke_result_t<F&> then_put_back(F& fn, PutBack&& put_back, Abandon&& abandon) {
  using R = std::invoke_result_t<F&>;
  try {
    if constexpr (std::is_void_v<R>) {
      fn();
      put_back();
    } else {
      R result = fn();
      put_back();
      return std::forward<R>(result);
    }
  } catch (...) {
    abandon();
    throw;
  }
}
}  // namespace detail

template <class Offload>
struct OffloadPlacement {
  static_assert(sizeof(Offload) == 0,
                "no engine placement for this offload policy: specialize OffloadPlacement<P> in a header of its "
                "own (see engine/offload/*.hpp)");
};

}  // namespace polyshard
