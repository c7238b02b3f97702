// The strategies polyshard-train names, grouped by sharding family: each family's engines are
// compiled in a translation unit of their own (family.cpp, built once per family), so that no
// translation unit holds every composition and the dispatch below instantiates none.
#pragma once

#include <string>

#include "options.hpp"
#include "polyshard/core/device.hpp"
#include "polyshard/data/text_dataset.hpp"
#include "polyshard/profile/trace.hpp"

namespace train {

/// One sharding and offload pair of --strategy; precision and wrapping make six strategies of each.
enum class Family { ddp, zero1, zero2, zero3, fsdp_grad_op, zero_offload, zero3_offload, hybrid, zero_infinity };

/// Trains one rank under the strategy of family F that the options name (precision and wrap),
/// computing on device D with communicator Comm. Defined in trainer.hpp and instantiated in
/// family.cpp, one translation unit per family and device.
template <Family F, class D, class Comm>
void train_family(const Options& o, Comm& comm, const polyshard::TextDataset& data, polyshard::Trace* trace);

/// Calls f.template operator()<F>() with the family of the strategy the options name.
template <class Fn>
void with_family(const Options& o, Fn&& f) {
  const std::string& s = o.strategy;
  if (s == "ddp") f.template operator()<Family::ddp>();
  else if (s == "zero1") f.template operator()<Family::zero1>();
  else if (s == "zero2" || s == "sharded_ddp") f.template operator()<Family::zero2>();
  else if (s == "zero3" || s == "fsdp") f.template operator()<Family::zero3>();
  else if (s == "fsdp_grad_op") f.template operator()<Family::fsdp_grad_op>();
  else if (s == "zero_offload") f.template operator()<Family::zero_offload>();
  else if (s == "zero3_offload") f.template operator()<Family::zero3_offload>();
  else if (s == "hybrid") f.template operator()<Family::hybrid>();
  else if (s == "zero_infinity") f.template operator()<Family::zero_infinity>();
  else polyshard::detail::throw_error("polyshard-train: unknown --strategy '", s, "' (see --help)");
}

}  // namespace train
