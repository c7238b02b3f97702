// OptimizerGroups: a unit's optimizer span stepped in sub-groups of at most
// StrategyConfig::sub_group_size elements (DeepSpeed's sub_group_size), each with an optimizer,
// and so optimizer state storages, of its own, and where an offload to NVMe asks for it master
// weights of its own: the offload brings one sub-group's state and masters into memory at a time.
// The span's runs of parameters with hyperparameters of their own (weight-decay exemptions, the
// optimizers of an OptimizerList) are sub-grouped apart. OptimizerGroupsView shows the groups as
// one optimizer over the span, the shape checkpoints read and write whatever the grouping.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/core/memory_tracker.hpp"
#include "polyshard/policy/config.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// What the sub-groups of every unit of an engine share when it steps several optimizers (an
/// OptimizerList), from the list itself: the state kinds of them all, each named once in list
/// order, which the views and checkpoints show for every span; the kinds each optimizer of the
/// list keeps, which checkpoints record per parameter; the most kinds one of them keeps, which
/// sizes NVMe's buffers; and the first's configured lr, which set_lr's lr stands for. Empty and
/// 0: the groups' own.
struct OptimizerListFacts {
  std::vector<std::string> state_names;
  std::vector<std::vector<std::string>> kinds;  // per optimizer of the list
  std::size_t most_state_kinds = 0;
  double reference_lr = 0;
};

/// One optimizer of type Opt per sub-group of a unit's optimizer span, group k over elements
/// [offset(k), offset(k) + numel(k)) of it. They step the same steps, so their step counts are
/// always equal, at learning rates in the ratios of their configs' (lr_scale).
template <class Opt>
class OptimizerGroups {
 public:
  using optimizer_type = Opt;
  using param_type = typename Opt::param_type;
  using StateList = decltype(std::declval<const Opt&>().state());
  /// The tensor type of the state, in the memory the optimizer steps in.
  using StateTensor = typename StateList::value_type::second_type;

  /// Groups over a span of `numel` elements, each built as Opt(config, its size).
  template <class Config>
  OptimizerGroups(const Config& config, std::size_t numel, std::int64_t group_size)
      : OptimizerGroups(std::vector<std::pair<std::int64_t, Config>>{{static_cast<std::int64_t>(numel), config}},
                        group_size) {}

  /// Groups over a span made of `runs`, (elements, config) pairs in span order: each run cut
  /// into sub-groups of at most `group_size`, each built as Opt(its run's config, its size). A
  /// run is a set of parameters with hyperparameters of their own (parameter_runs).
  /// `list`: what the groups share with the engine's other units (OptimizerListFacts).
  template <class Config>
  OptimizerGroups(const std::vector<std::pair<std::int64_t, Config>>& runs, std::int64_t group_size,
                  OptimizerListFacts list = {})
      : state_names_(std::move(list.state_names)),
        kinds_(std::move(list.kinds)),
        most_state_kinds_(list.most_state_kinds) {
    POLYSHARD_CHECK(!runs.empty(), "OptimizerGroups: a span of no runs");
    std::int64_t at = 0;
    for (const auto& [elements, config] : runs)
      for (const std::int64_t n : sub_group_sizes(elements, group_size)) {
        if (n == 0 && runs.size() > 1) continue;  // only an empty span is an empty group
        groups_.emplace_back(config, static_cast<std::size_t>(n));
        offsets_.push_back(at);
        at += n;
      }
    numel_ = static_cast<std::size_t>(at);
    const double reference = list.reference_lr != 0 ? list.reference_lr : groups_.front().lr();
    for (const Opt& g : groups_) lr_scale_.push_back(reference == 0 ? 1.0 : g.lr() / reference);
    if (state_names_.empty())
      for (const auto& [name, tensor] : groups_.front().state()) state_names_.push_back(name);
    if (most_state_kinds_ == 0) most_state_kinds_ = state_names_.size();
  }

  std::size_t size() const { return groups_.size(); }
  Opt& operator[](std::size_t k) { return groups_[k]; }
  const Opt& operator[](std::size_t k) const { return groups_[k]; }
  auto begin() { return groups_.begin(); }
  auto end() { return groups_.end(); }
  auto begin() const { return groups_.begin(); }
  auto end() const { return groups_.end(); }
  /// Where group k starts in the span, and its size.
  std::int64_t offset(std::size_t k) const { return offsets_[k]; }
  std::int64_t numel(std::size_t k) const { return static_cast<std::int64_t>(groups_[k].numel()); }

  /// The span's size.
  std::size_t numel() const { return numel_; }
  std::int64_t step_count() const { return groups_.front().step_count(); }
  void set_step_count(std::int64_t step) {
    for (Opt& g : groups_) g.set_step_count(step);
  }
  /// The learning rate set_lr last set: the reference's, which a group's is lr_scale(k) times.
  double lr() const { return groups_.front().lr() / lr_scale_.front(); }
  void set_lr(double lr) {
    for (std::size_t k = 0; k < groups_.size(); ++k) groups_[k].set_lr(lr_scale_[k] == 1.0 ? lr : lr * lr_scale_[k]);
  }
  /// Group k's configured lr over the reference's: its learning rate is set_lr's times this.
  double lr_scale(std::size_t k) const { return lr_scale_[k]; }
  std::size_t state_bytes() const {
    std::size_t bytes = 0;
    for (const Opt& g : groups_) bytes += g.state_bytes();
    return bytes;
  }
  /// The most state values a group keeps per parameter.
  int states_per_param() const
    requires requires(const Opt& o) { o.states_per_param(); }
  {
    int most = 0;
    for (const Opt& g : groups_) most = std::max(most, g.states_per_param());
    return most;
  }
  /// Gives each group master weights of its own, copied from its slice of `master` (the unit's,
  /// over the whole span), and frees `master`'s elements: they then live in the groups, which an
  /// offload to NVMe moves group by group. OptimizerGroupsView puts them together again.
  void hold_masters_apart(const StateTensor& master) {
    POLYSHARD_CHECK(master.numel() == static_cast<std::int64_t>(numel_), "OptimizerGroups: masters of ",
                    master.numel(), " elements for a span of ", numel_);
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      StateTensor own = StateTensor::empty({numel(k)}, master.storage()->category());
      own.copy_from(master.flat_view(offset(k), numel(k)));
      masters_.push_back(std::move(own));
    }
    master.storage()->release();
  }
  /// Whether the groups hold the master weights (hold_masters_apart).
  bool hold_masters() const { return !masters_.empty(); }
  /// Group k's own master weights (hold_masters()).
  const StateTensor& master(std::size_t k) const { return masters_[k]; }
  /// What group k steps: its own masters, or its slice of the span's, `span_params`.
  StateTensor params(std::size_t k, const StateTensor& span_params) const {
    return hold_masters() ? masters_[k] : span_params.flat_view(offset(k), numel(k));
  }

  /// The most state tensors one optimizer of the engine keeps (SGD's one beside Adam's two).
  std::size_t most_state_kinds() const { return most_state_kinds_; }
  /// The names of the state tensors the view shows, PyTorch's, in the optimizers' order: every
  /// kind any optimizer of the engine keeps, whether or not this span's groups keep it.
  const std::vector<std::string>& state_names() const { return state_names_; }
  /// The state kinds optimizer `optimizer` of the engine's list keeps (UnitEntry::optimizer):
  /// state_names() where the engine has one optimizer.
  const std::vector<std::string>& kinds_of(std::size_t optimizer) const {
    return kinds_.empty() ? state_names_ : kinds_.at(optimizer);
  }

 private:
  std::vector<Opt> groups_;
  std::vector<std::string> state_names_;
  std::vector<std::vector<std::string>> kinds_;
  std::size_t most_state_kinds_;
  std::vector<double> lr_scale_;
  std::vector<StateTensor> masters_;  // hold_masters_apart's, else empty
  std::vector<std::int64_t> offsets_;
  std::size_t numel_ = 0;
};

/// How a unit's optimizer span, elements [begin, begin + numel) of the unit, splits by the
/// hyperparameters of its parameters: consecutive (elements, key) runs covering the span,
/// adjacent runs of equal keys merged. Parameter i starts at offsets[i] (increasing) and is
/// stepped as `keys[i]` says (whether it decays, which optimizer of a list steps it); the
/// elements after a parameter up to the next one (padding) go with it, those before the first
/// parameter with the first. No parameters: one run of `none`.
template <class Key>
std::vector<std::pair<std::int64_t, Key>> parameter_runs(const std::vector<std::int64_t>& offsets,
                                                         const std::vector<Key>& keys, std::int64_t begin,
                                                         std::int64_t numel, const Key& none) {
  POLYSHARD_CHECK(offsets.size() == keys.size(), "parameter_runs: ", offsets.size(), " offsets for ", keys.size(),
                  " keys");
  std::vector<std::pair<std::int64_t, Key>> runs;
  const std::int64_t end = begin + numel;
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    const std::int64_t from = std::max(begin, i == 0 ? begin : offsets[i]);
    const std::int64_t to = std::min(end, i + 1 < offsets.size() ? offsets[i + 1] : end);
    if (from >= to) continue;
    const Key key = keys[i];
    if (!runs.empty() && runs.back().second == key) runs.back().first += to - from;
    else runs.emplace_back(to - from, key);
  }
  if (runs.empty()) runs.emplace_back(numel, none);
  return runs;
}

/// parameter_runs keyed by whether weight decay applies (`decays[i]`; no parameters: decay).
inline std::vector<std::pair<std::int64_t, bool>> weight_decay_runs(const std::vector<std::int64_t>& offsets,
                                                                    const std::vector<bool>& decays,
                                                                    std::int64_t begin, std::int64_t numel) {
  return parameter_runs<bool>(offsets, decays, begin, numel, true);
}

/// The unit's master weights `master` over the span (Behaviour::optimizer_params) with their
/// elements for the lifetime of this object, filled from `groups` where the groups hold them
/// (hold_masters_apart; else `master` is left as it is); write_back() puts them back there.
template <class Opt>
class GroupMasters {
 public:
  using StateTensor = typename OptimizerGroups<Opt>::StateTensor;

  GroupMasters(OptimizerGroups<Opt>& groups, const StateTensor& master) : groups_(groups), master_(master) {
    if (!groups.hold_masters()) return;
    master_.storage()->materialize();
    for (std::size_t k = 0; k < groups.size(); ++k)
      master_.flat_view(groups.offset(k), groups.numel(k)).copy_from(groups.master(k));
  }
  ~GroupMasters() {
    if (groups_.hold_masters()) master_.storage()->release();
  }
  GroupMasters(const GroupMasters&) = delete;
  GroupMasters& operator=(const GroupMasters&) = delete;

  /// Puts the masters, as changed since construction, into the groups that hold them.
  void write_back() {
    if (groups_.hold_masters())
      for (std::size_t k = 0; k < groups_.size(); ++k)
        groups_.master(k).copy_from(master_.flat_view(groups_.offset(k), groups_.numel(k)));
  }

 private:
  OptimizerGroups<Opt>& groups_;
  StateTensor master_;
};

/// OptimizerGroups seen as one optimizer over the whole span, for what reads and writes state
/// tensors (checkpoints, tests): state() has one tensor per kind as long as the span. One group's
/// tensors are its own; several groups' are copies, which write_back() puts into the groups.
/// Where the groups hold the master weights, the view gives the unit's `master` its elements for
/// its lifetime (GroupMasters), and write_back() puts them back too.
/// Offers param_type, state(), numel(), step_count(), set_step_count(), states_per_param().
template <class Opt>
class OptimizerGroupsView {
 public:
  using param_type = typename Opt::param_type;
  using StateList = typename OptimizerGroups<Opt>::StateList;
  using StateTensor = typename OptimizerGroups<Opt>::StateTensor;

  /// `master`: the unit's master weights over the span (Behaviour::optimizer_params), which
  /// have no elements where the groups hold them; only read then.
  explicit OptimizerGroupsView(OptimizerGroups<Opt>& groups, const StateTensor& master = {})
      : groups_(groups), masters_(groups, master) {
    if (groups.size() == 1 && kinds(groups[0].state()) == groups.state_names()) {
      state_ = groups[0].state();
      aliased_ = true;
      return;
    }
    // Zeros where a group keeps no such kind (an SGD's part of a span's exp_avg).
    for (const std::string& name : groups.state_names())
      state_.emplace_back(name, StateTensor::zeros({static_cast<std::int64_t>(groups.numel())}, MemoryCategory::Other));
    copy(/*into_groups=*/false);
  }

  const StateList& state() const { return state_; }
  std::size_t numel() const { return groups_.numel(); }
  std::int64_t step_count() const { return groups_.step_count(); }
  void set_step_count(std::int64_t step) { groups_.set_step_count(step); }
  int states_per_param() const { return static_cast<int>(state_.size()); }

  /// Puts the view's state and masters, as changed since construction, into the groups.
  void write_back() {
    if (!aliased_) copy(/*into_groups=*/true);
    masters_.write_back();
  }

 private:
  static std::vector<std::string> kinds(const StateList& state) {
    std::vector<std::string> names;
    for (const auto& [name, tensor] : state) names.push_back(name);
    return names;
  }
  void copy(bool into_groups) {
    for (std::size_t k = 0; k < groups_.size(); ++k)
      for (const auto& [name, part] : groups_[k].state()) {
        const auto s = std::find_if(state_.begin(), state_.end(), [&](const auto& t) { return t.first == name; });
        POLYSHARD_CHECK(s != state_.end(), "OptimizerGroupsView: sub-group ", k, " keeps state '", name,
                        "', which the engine's optimizers do not name");
        POLYSHARD_CHECK(part.numel() == groups_.numel(k), "OptimizerGroupsView: the optimizer's ", name, " has ",
                        part.numel(), " values for a sub-group of ", groups_.numel(k), " elements: ",
                        "sub_group_size needs one value per element");
        const StateTensor whole = s->second.flat_view(groups_.offset(k), groups_.numel(k));
        if (into_groups) part.copy_from(whole);
        else whole.copy_from(part);
      }
  }

  OptimizerGroups<Opt>& groups_;
  GroupMasters<Opt> masters_;
  StateList state_;
  bool aliased_ = false;  // state_ holds the one group's own tensors
};

}  // namespace polyshard
