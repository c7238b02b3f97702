// Reverse-mode sweep: from a result back to every leaf that needs a gradient.
#pragma once

#include <cmath>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "polyshard/autograd/ops/accumulate.hpp"
#include "polyshard/autograd/variable.hpp"
#include "polyshard/core/precompiled.hpp"

namespace polyshard {

namespace detail {
/// Nodes reachable from `root` through recorded inputs, each after all of its inputs. The
/// list owns its nodes, so the sweep can cut the graph's own links as it goes.
template <FloatElement T, Device D>
std::vector<std::shared_ptr<Node<T, D>>> topological_order(const std::shared_ptr<Node<T, D>>& root) {
  std::vector<std::shared_ptr<Node<T, D>>> order;
  std::unordered_set<Node<T, D>*> seen{root.get()};
  // Iterative depth-first search: a deep network must not overflow the stack.
  std::vector<std::pair<std::shared_ptr<Node<T, D>>, std::size_t>> stack{{root, 0}};
  while (!stack.empty()) {
    auto& top = stack.back();
    if (top.second < top.first->inputs.size()) {
      std::shared_ptr<Node<T, D>> child = top.first->inputs[top.second++];
      if (child->requires_grad && seen.insert(child.get()).second) stack.emplace_back(std::move(child), 0);
    } else {
      order.push_back(std::move(top.first));
      stack.pop_back();
    }
  }
  return order;
}
}  // namespace detail

/// Tells `hook`, during the outermost backward sweep this thread runs while the scope lives, of
/// each leaf whose gradient is final for that sweep: every node that reads the leaf has run,
/// and no node that sweeps again (a checkpoint, whose recomputed graph may read the leaf too)
/// is left; leaves finished while one is left are told when the last one has run. Leaves
/// reached only by such inner sweeps are not told. A data-parallel engine launches a bucket's
/// reduction once all its parameters' gradients are final, while backward goes on.
template <FloatElement T, Device D>
class GradientReadyScope {
 public:
  using Hook = std::function<void(Node<T, D>& leaf)>;
  explicit GradientReadyScope(Hook hook) : hook_(std::move(hook)), saved_(current()) { current() = &hook_; }
  ~GradientReadyScope() { current() = saved_; }
  GradientReadyScope(const GradientReadyScope&) = delete;
  GradientReadyScope& operator=(const GradientReadyScope&) = delete;

  /// The hook in force on this thread (null: none, or inside a sweep already).
  static Hook*& current() {
    thread_local Hook* hook = nullptr;
    return hook;
  }

 private:
  Hook hook_;
  Hook* saved_;
};

namespace detail {
/// The bookkeeping of GradientReadyScope for one sweep: which nodes read each leaf, and the
/// nodes that sweep again, left to run.
template <FloatElement T, Device D>
class LeafReaders {
 public:
  LeafReaders(typename GradientReadyScope<T, D>::Hook& hook, const std::vector<std::shared_ptr<Node<T, D>>>& order)
      : hook_(hook) {
    for (const auto& n : order) {
      if (!n->backward) continue;
      if (n->sweeps_again) ++sweeping_left_;
      for_each_leaf(*n, [&](Node<T, D>* leaf) { ++readers_[leaf]; });
    }
  }
  /// After `node` ran (or was skipped for want of a gradient): its leaves have one reader less.
  void ran(Node<T, D>& node) {
    for_each_leaf(node, [&](Node<T, D>* leaf) {
      if (--readers_[leaf] == 0) final_.push_back(leaf);
    });
    if (node.sweeps_again) --sweeping_left_;
    if (sweeping_left_ > 0) return;
    for (Node<T, D>* leaf : final_) hook_(*leaf);
    final_.clear();
  }

 private:
  /// Each distinct leaf input of `node` (an op may read one input twice: x * x).
  template <class F>
  static void for_each_leaf(Node<T, D>& node, F&& f) {
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      Node<T, D>* in = node.inputs[i].get();
      if (in->backward || !in->requires_grad) continue;
      bool repeated = false;
      for (std::size_t j = 0; j < i && !repeated; ++j) repeated = node.inputs[j].get() == in;
      if (!repeated) f(in);
    }
  }

  typename GradientReadyScope<T, D>::Hook& hook_;
  std::unordered_map<Node<T, D>*, int> readers_;
  std::vector<Node<T, D>*> final_;
  int sweeping_left_ = 0;
};
}  // namespace detail

/// Propagates `seed` (the gradient of some scalar with respect to `root`) back through the
/// graph, accumulating into the gradients of leaves. Intermediate gradients, saved activations
/// and the graph itself are released as the sweep passes them, so each is freed as early as it
/// can be.
template <FloatElement T, Device D>
void backward(const Var<T, D>& root, const Tensor<T, D>& seed) {
  POLYSHARD_CHECK(root.requires_grad(), "backward: the result does not require a gradient (no input needs one, "
                                        "or it was computed under NoGradGuard)");
  check_same_shape("backward (seed gradient)", seed.shape(), root.shape());
  GradSink<T, D> s = root.node()->sink();
  accumulate_into(s, seed);
  std::vector<std::shared_ptr<Node<T, D>>> order = detail::topological_order(root.node());
  // A sweep inside this one (a checkpoint's) sees no hook: only this sweep knows every reader.
  auto*& in_force = GradientReadyScope<T, D>::current();
  struct Suspend {
    typename GradientReadyScope<T, D>::Hook*& slot;
    typename GradientReadyScope<T, D>::Hook* hook = slot;
    ~Suspend() { slot = hook; }
  } suspend{in_force};
  in_force = nullptr;
  std::optional<detail::LeafReaders<T, D>> readers;
  if (suspend.hook) readers.emplace(*suspend.hook, order);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node<T, D>& node = **it;
    if (node.backward) {  // not a leaf
      if (node.has_grad) node.backward(node);
      if (readers) readers->ran(node);
      node.backward = nullptr;
      node.inputs.clear();
      node.grad = Tensor<T, D>();
      node.has_grad = false;
      node.grad_factor = 1.0;
    }
    it->reset();  // the last owner of an intermediate frees its activations here
  }
}

/// Backward from a scalar (a loss): the seed is 1.
template <FloatElement T, Device D>
void backward(const Var<T, D>& loss) {
  POLYSHARD_CHECK(loss.value().numel() == 1, "backward: needs a scalar loss or an explicit seed gradient, got shape ",
                  loss.shape());
  backward(loss, Tensor<T, D>::full(loss.shape(), T(1)));
}

/// Backward from a scalar (a loss) seeded with `seed`, given in double so that a 16-bit graph
/// can be seeded with a value its type cannot hold: a loss scale of 65536 or more is infinite
/// as fp16 (whose largest value is 65504), although the gradients it scales may all fit. When T
/// holds `seed` this is backward(loss, seed as T). Otherwise, when the loss's op reads its
/// gradient in double on the host (Node::scalar_grad_op: cross_entropy, sum, mean), the root
/// holds 1 and carries `seed` as its grad_factor, so only the gradients the op writes meet T's
/// range; other ops get the seed as T (infinite: their gradients overflow, as they would).
template <FloatElement T, Device D>
void backward(const Var<T, D>& loss, double seed) {
  POLYSHARD_CHECK(loss.value().numel() == 1, "backward: needs a scalar loss for a scalar seed, got shape ",
                  loss.shape());
  const T as_t = static_cast<T>(static_cast<float>(seed));
  Node<T, D>& root = *loss.node();
  if (std::isfinite(static_cast<double>(as_t)) || !std::isfinite(seed) || !root.scalar_grad_op || !root.backward) {
    backward(loss, Tensor<T, D>::full(loss.shape(), as_t));
    return;
  }
  root.grad_factor = seed;
  try {
    backward(loss, Tensor<T, D>::full(loss.shape(), T(1)));
  } catch (...) {
    root.grad_factor = 1.0;
    throw;
  }
}

/// The float and double host instances compiled once in a precompiled library (core/precompiled.hpp).
#define POLYSHARD_AUTOGRAD_BACKWARD_INSTANCES(EXTERN, T) \
  EXTERN template void backward<T, Cpu>(const Var<T, Cpu>&, const Tensor<T, Cpu>&); \
  EXTERN template void backward<T, Cpu>(const Var<T, Cpu>&);
POLYSHARD_DECLARE_PRECOMPILED(POLYSHARD_AUTOGRAD_BACKWARD_INSTANCES)

}  // namespace polyshard
