// AdamW: Adam with decoupled weight decay (torch.optim.AdamW), default weight decay 1e-2.
#pragma once

#include "polyshard/optim/adam.hpp"

namespace polyshard {

/// AdamW over one flat parameter span of a fixed size: before each Adam step the weights shrink
/// by lr * weight_decay, as in torch.optim.AdamW. Same interface and state as Adam; the config
/// is AdamWConfig, whose weight_decay defaults to 1e-2 as PyTorch's does.
template <class P>
class AdamW : public detail::AdamBase<P, AdamWConfig, true> {
 public:
  /// config: hyperparameters; numel: size of the parameter span every step() receives.
  AdamW(AdamWConfig config, std::size_t numel) : detail::AdamBase<P, AdamWConfig, true>(config, numel, "AdamW") {}
};

}  // namespace polyshard
