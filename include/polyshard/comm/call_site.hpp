// What the code issuing collectives is doing, compared across ranks with every call, so that
// ranks that diverge are told where ("the forward gather of unit 'transformer.h.0' (step 3,
// micro-batch 2)"), not only that the sizes differ.
#pragma once

#include <string>
#include <utility>

namespace polyshard {

/// A scope naming the collectives the calling thread issues inside it. Every backend records the
/// innermost site's text with each call (asynchronous calls keep the site they were issued
/// under); a backend that checks calls across ranks compares it with the call, and a mismatch or
/// a timeout names it. Outside any scope the site is "" and calls are compared by their
/// arguments alone. The engine names each unit's gathers and reductions and its step's
/// collectives; code of one's own may name its own calls the same way:
///
///     polyshard::CallSite site("the loss average of the evaluation");
///     comm.all_reduce(std::span<double>(&loss, 1), polyshard::ReduceOp::Avg);
///
/// Sites nest (the innermost wins) and belong to the thread that opened them.
class CallSite {
 public:
  /// Names the calls this thread issues until the scope ends.
  explicit CallSite(std::string text) : text_(std::move(text)), outer_(innermost()) { innermost() = this; }
  ~CallSite() { innermost() = outer_; }
  CallSite(const CallSite&) = delete;
  CallSite& operator=(const CallSite&) = delete;

  /// The text of this thread's innermost site; "" outside any.
  static const std::string& current() {
    static const std::string none;
    const CallSite* site = innermost();
    return site ? site->text_ : none;
  }

 private:
  static const CallSite*& innermost() {
    thread_local const CallSite* site = nullptr;
    return site;
  }

  std::string text_;
  const CallSite* outer_;
};

}  // namespace polyshard
