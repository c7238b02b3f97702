// An optimizer whose state lives in device memory, seen from the host: what checkpoints read
// and write, without io knowing where an engine keeps its state.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// Host copies of `Opt`'s state tensors (in the memory device D copies fastest to), taken at
/// construction; write_back() copies them up again. The step count is the optimizer's own.
/// Offers what io uses of an optimizer: param_type, state(), numel(), step_count(),
/// set_step_count().
template <class Opt, Device D>
class HostOptimizerView {
 public:
  using param_type = typename Opt::param_type;

  explicit HostOptimizerView(Opt& opt) : opt_(opt) {
    for (const auto& [name, tensor] : opt.state()) {
      Tensor<param_type> host = host_staging_tensor<param_type, D>(tensor.shape(), MemoryCategory::Other);
      copy_across(tensor, host);
      state_.emplace_back(name, std::move(host));
    }
  }

  /// (name, host tensor) pairs, in the optimizer's order.
  const std::vector<std::pair<std::string, Tensor<param_type>>>& state() const { return state_; }
  std::size_t numel() const { return opt_.numel(); }
  std::int64_t step_count() const { return opt_.step_count(); }
  void set_step_count(std::int64_t step) { opt_.set_step_count(step); }

  /// Copies the host tensors, as changed since construction, into the optimizer's state.
  void write_back() const {
    const auto device_state = opt_.state();
    for (std::size_t i = 0; i < state_.size(); ++i) copy_across(state_[i].second, device_state[i].second);
  }

 private:
  Opt& opt_;
  std::vector<std::pair<std::string, Tensor<param_type>>> state_;
};

}  // namespace polyshard
