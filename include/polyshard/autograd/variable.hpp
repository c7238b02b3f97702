// Var: a tensor with a place in the reverse-mode graph (its gradient and how to pass it back).
#pragma once

#include <concepts>
#include <functional>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

#include "polyshard/autograd/grad_mode.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

template <FloatElement T, Device D = Cpu>
struct Node;

/// Where a backward function writes the gradient of one input: into `tensor`, adding to what
/// is there when `accumulate` is true, overwriting it otherwise. Undefined when the input needs
/// no gradient, in which case the backward function skips that input.
template <FloatElement T, Device D = Cpu>
struct GradSink {
  Tensor<T, D> tensor;
  bool accumulate = false;
  bool wanted() const { return tensor.defined(); }
};

/// A node of the graph. Leaves (parameters, inputs) have no backward function; their gradient
/// tensor may be bound in advance to a view of a flat gradient buffer, which is where their
/// gradients then accumulate.
template <FloatElement T, Device D>
struct Node {
  Tensor<T, D> value;
  Tensor<T, D> grad;
  /// False after zero_grad(set_to_none): the next gradient overwrites `grad` instead of adding.
  bool has_grad = false;
  bool requires_grad = false;
  const char* op = "leaf";
  std::vector<std::shared_ptr<Node>> inputs;
  /// Reads `self.grad` and writes into the sinks of `self.inputs`.
  std::function<void(Node& self)> backward;
  /// The backward function reads the (scalar) gradient only through detail::scalar_grad, on
  /// the host: cross_entropy, sum, mean. Such a node can be the root of a sweep seeded with a
  /// value T cannot hold (backward(loss, double)).
  bool scalar_grad_op = false;
  /// What `grad` is multiplied by, in double, where scalar_grad reads it: 1 but at the root of
  /// backward(loss, double) seeded past T's range (a loss scale above fp16's 65504), which
  /// holds `grad` 1 and the seed here.
  double grad_factor = 1.0;
  /// The backward function runs a sweep of its own over a graph it builds (a checkpoint's
  /// recomputation), which may read leaves this graph does not show it reading.
  bool sweeps_again = false;
  /// The backward of the op that made this node never reads `value` (linear, gelu_mlp). A
  /// consumer whose backward reads no input value either (add) may then write its result into
  /// this storage, when nothing else holds the node or the storage (detail::scratch_for): the
  /// residual stream's add keeps one tensor alive where it kept two, the projection's output
  /// that nothing would read again.
  bool value_is_scratch = false;

  /// Claims this node's gradient slot for one contribution.
  GradSink<T, D> sink() {
    if (!requires_grad) return {};
    if (has_grad) return {grad, true};
    if (!grad.defined() || !(grad.shape() == value.shape())) {
      grad = Tensor<T, D>::empty(value.shape(),
                              inputs.empty() && !backward ? MemoryCategory::Gradients : MemoryCategory::Activations);
    }
    has_grad = true;
    return {grad, false};
  }
};

namespace detail {
/// The one element of a scalar tensor, read on the host (from a device: waits for it).
template <FloatElement T, Device D>
T scalar_value(const Tensor<T, D>& t) {
  if constexpr (std::same_as<D, Cpu>) return t.data()[0];
  else return t.to_vector()[0];
}
/// The gradient of a scalar node, read on the host in double, with the factor a root seeded
/// past T's range carries (Node::grad_factor). Backward functions of scalar_grad_op nodes read
/// their gradient through this alone.
template <FloatElement T, Device D>
double scalar_grad(const Node<T, D>& self) {
  return double(scalar_value(self.grad)) * self.grad_factor;
}
/// The element type of per-row statistics a kernel saves (layer-norm mean and rstd,
/// cross-entropy losses and log-sum-exp): T on the host, float on a device (whatever T).
template <class T, class D>
using stats_t = std::conditional_t<std::same_as<D, Cpu>, T, float>;
}  // namespace detail

/// A handle to a node: cheap to copy, shares the node.
template <FloatElement T, Device D = Cpu>
class Var {
 public:
  using value_type = T;

  Var() = default;
  /// A leaf holding `value`; with `requires_grad` its gradient is accumulated by backward().
  explicit Var(Tensor<T, D> value, bool requires_grad = false) : node_(std::make_shared<Node<T, D>>()) {
    node_->value = std::move(value);
    node_->requires_grad = requires_grad;
  }
  explicit Var(std::shared_ptr<Node<T, D>> node) : node_(std::move(node)) {}

  bool defined() const { return node_ != nullptr; }
  const Tensor<T, D>& value() const { return node_->value; }
  /// The gradient, or an undefined tensor when none has flowed here since the last zeroing.
  Tensor<T, D> grad() const { return node_->has_grad ? node_->grad : Tensor<T, D>(); }
  const Shape& shape() const { return node_->value.shape(); }
  /// The value of a one-element variable (a loss), as a double read on the host: from a device
  /// it waits for the value. An error naming the shape for any other variable.
  double item() const {
    POLYSHARD_CHECK(defined(), "Var::item: the variable is undefined");
    POLYSHARD_CHECK(node_->value.numel() == 1, "Var::item: a variable of shape ", node_->value.shape(),
                    " has ", node_->value.numel(), " elements, not one");
    return double(detail::scalar_value(node_->value));
  }
  bool requires_grad() const { return node_ && node_->requires_grad; }
  const std::shared_ptr<Node<T, D>>& node() const { return node_; }

  /// Forgets the gradient; the next backward overwrites instead of accumulating.
  void zero_grad() const { node_->has_grad = false; }

 private:
  std::shared_ptr<Node<T, D>> node_;
};

/// Builds the result of an operation. When recording is on and some input needs a gradient,
/// the result remembers its inputs and `backward`; otherwise it is a plain leaf and the
/// backward function (and everything it captured) is dropped at once.
template <FloatElement T, Device D, class Backward>
Var<T, D> make_result(Tensor<T, D> value, const char* op, std::initializer_list<Var<T, D>> inputs, Backward&& backward) {
  auto node = std::make_shared<Node<T, D>>();
  node->value = std::move(value);
  node->op = op;
  bool needs = false;
  for (const Var<T, D>& in : inputs) needs = needs || in.requires_grad();
  if (needs && grad_enabled()) {
    node->requires_grad = true;
    node->inputs.reserve(inputs.size());
    for (const Var<T, D>& in : inputs) node->inputs.push_back(in.node());
    node->backward = std::forward<Backward>(backward);
  }
  return Var<T, D>(std::move(node));
}

namespace detail {
/// The storage of `v`'s value when a result of `shape` may be written there (Node::
/// value_is_scratch): v is a contiguous, whole tensor of that shape, no backward reads it, and
/// the caller's handle is the only one to the node and to the storage, so that nothing can read
/// the old value again. Undefined otherwise.
template <FloatElement T, Device D>
Tensor<T, D> scratch_for(const Var<T, D>& v, const Shape& shape) {
  if (!v.defined() || !v.node()->value_is_scratch || v.node().use_count() != 1) return {};
  const Tensor<T, D>& t = v.value();
  if (!t.defined() || t.storage().use_count() != 1 || !(t.shape() == shape) || !t.is_contiguous() ||
      t.offset() != 0 || std::size_t(t.numel()) != t.storage()->numel())
    return {};
  return t;
}

/// `v` as a node that reads its gradient through scalar_grad (see Node::scalar_grad_op).
template <FloatElement T, Device D>
Var<T, D> reads_scalar_grad(Var<T, D> v) {
  v.node()->scalar_grad_op = true;
  return v;
}
}  // namespace detail

}  // namespace polyshard
