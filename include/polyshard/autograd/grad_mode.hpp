// Whether operations record the graph for backward: on by default, off inside a NoGradGuard.
#pragma once

namespace polyshard {

namespace detail {
inline bool& grad_enabled_flag() {
  thread_local bool enabled = true;
  return enabled;
}
}  // namespace detail

/// True when operations on this thread record their inputs for backward.
inline bool grad_enabled() { return detail::grad_enabled_flag(); }

/// Switches recording on or off for this thread until the scope ends.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : saved_(detail::grad_enabled_flag()) {
    detail::grad_enabled_flag() = enabled;
  }
  ~GradModeGuard() { detail::grad_enabled_flag() = saved_; }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool saved_;
};

/// No graph is recorded in this scope: evaluation, optimizer steps, recomputation set-up.
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

}  // namespace polyshard
