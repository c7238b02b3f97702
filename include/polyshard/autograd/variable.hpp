// Var: a tensor with a place in the reverse-mode graph (its gradient and how to pass it back).
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "polyshard/autograd/grad_mode.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

template <FloatElement T>
struct Node;

/// Where a backward function writes the gradient of one input: into `tensor`, adding to what
/// is there when `accumulate` is true, overwriting it otherwise. Undefined when the input needs
/// no gradient, in which case the backward function skips that input.
template <FloatElement T>
struct GradSink {
  Tensor<T> tensor;
  bool accumulate = false;
  bool wanted() const { return tensor.defined(); }
};

/// A node of the graph. Leaves (parameters, inputs) have no backward function; their gradient
/// tensor may be bound in advance to a view of a flat gradient buffer, which is where their
/// gradients then accumulate.
template <FloatElement T>
struct Node {
  Tensor<T> value;
  Tensor<T> grad;
  /// False after zero_grad(set_to_none): the next gradient overwrites `grad` instead of adding.
  bool has_grad = false;
  bool requires_grad = false;
  const char* op = "leaf";
  std::vector<std::shared_ptr<Node>> inputs;
  /// Reads `self.grad` and writes into the sinks of `self.inputs`.
  std::function<void(Node& self)> backward;

  /// Claims this node's gradient slot for one contribution.
  GradSink<T> sink() {
    if (!requires_grad) return {};
    if (has_grad) return {grad, true};
    if (!grad.defined() || !(grad.shape() == value.shape())) {
      grad = Tensor<T>::empty(value.shape(),
                              inputs.empty() && !backward ? MemoryCategory::Gradients : MemoryCategory::Activations);
    }
    has_grad = true;
    return {grad, false};
  }
};

/// A handle to a node: cheap to copy, shares the node.
template <FloatElement T>
class Var {
 public:
  using value_type = T;

  Var() = default;
  /// A leaf holding `value`; with `requires_grad` its gradient is accumulated by backward().
  explicit Var(Tensor<T> value, bool requires_grad = false) : node_(std::make_shared<Node<T>>()) {
    node_->value = std::move(value);
    node_->requires_grad = requires_grad;
  }
  explicit Var(std::shared_ptr<Node<T>> node) : node_(std::move(node)) {}

  bool defined() const { return node_ != nullptr; }
  const Tensor<T>& value() const { return node_->value; }
  /// The gradient, or an undefined tensor when none has flowed here since the last zeroing.
  Tensor<T> grad() const { return node_->has_grad ? node_->grad : Tensor<T>(); }
  const Shape& shape() const { return node_->value.shape(); }
  bool requires_grad() const { return node_ && node_->requires_grad; }
  const std::shared_ptr<Node<T>>& node() const { return node_; }

  /// Forgets the gradient; the next backward overwrites instead of accumulating.
  void zero_grad() const { node_->has_grad = false; }

 private:
  std::shared_ptr<Node<T>> node_;
};

/// Builds the result of an operation. When recording is on and some input needs a gradient,
/// the result remembers its inputs and `backward`; otherwise it is a plain leaf and the
/// backward function (and everything it captured) is dropped at once.
template <FloatElement T, class Backward>
Var<T> make_result(Tensor<T> value, const char* op, std::initializer_list<Var<T>> inputs, Backward&& backward) {
  auto node = std::make_shared<Node<T>>();
  node->value = std::move(value);
  node->op = op;
  bool needs = false;
  for (const Var<T>& in : inputs) needs = needs || in.requires_grad();
  if (needs && grad_enabled()) {
    node->requires_grad = true;
    node->inputs.reserve(inputs.size());
    for (const Var<T>& in : inputs) node->inputs.push_back(in.node());
    node->backward = std::forward<Backward>(backward);
  }
  return Var<T>(std::move(node));
}

}  // namespace polyshard
