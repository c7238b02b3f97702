// A trainable tensor of a module: its shape and initialisation are known at construction; its
// storage is bound later to a view of a flat buffer (see FlatParameters).
#pragma once

#include <string>

#include "polyshard/autograd/variable.hpp"

namespace polyshard {

/// How a parameter's initial values are drawn (GPT-2's scheme needs nothing more).
struct ParameterInit {
  enum class Kind { Zeros, Ones, Normal } kind = Kind::Zeros;
  double std = 0.0;

  static ParameterInit zeros() { return {Kind::Zeros, 0.0}; }
  static ParameterInit ones() { return {Kind::Ones, 0.0}; }
  static ParameterInit normal(double std) { return {Kind::Normal, std}; }
};

/// A leaf of the autograd graph with a fixed shape. Until it is bound to storage (a view of a
/// flat parameter buffer, a gathered shard), using it is an error that names it: a module
/// never silently computes with memory it does not own.
template <FloatElement T, Device D = Cpu>
class Parameter {
 public:
  Parameter() = default;
  Parameter(Shape shape, ParameterInit init) : shape_(shape), init_(init), var_(Tensor<T, D>(), true) {}

  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return shape_.numel(); }
  const ParameterInit& init() const { return init_; }
  void set_init(ParameterInit init) { init_ = init; }

  /// The PyTorch-style name given when the parameter was bound ("transformer.h.0.ln_1.weight").
  const std::string& name() const { return name_; }

  /// True when the parameter has elements to compute with: bound, and its storage not released.
  bool bound() const {
    return var_.defined() && var_.value().defined() && var_.value().storage()->materialized();
  }

  /// The graph leaf to compute with; throws when the parameter has no storage.
  const Var<T, D>& var() const {
    if (!bound()) [[unlikely]] throw_unbound();
    return var_;
  }
  /// The graph leaf whether or not it has storage now (for bookkeeping of gradient flags).
  const Var<T, D>& leaf() const { return var_; }
  Tensor<T, D> value() const { return var().value(); }
  Tensor<T, D> grad() const { return var().grad(); }

  /// Points the parameter at `value` and its gradient at `grad` (both of this shape; `grad`
  /// may be undefined to let backward allocate one). The gradient starts out empty.
  void bind(std::string name, const Tensor<T, D>& value, const Tensor<T, D>& grad) {
    check_same_shape("Parameter::bind (value)", value.shape(), shape_);
    if (grad.defined()) check_same_shape("Parameter::bind (gradient)", grad.shape(), shape_);
    name_ = std::move(name);
    const bool requires_grad = var_.defined() ? var_.requires_grad() : true;
    var_ = Var<T, D>(value, requires_grad);
    var_.node()->grad = grad;
  }

  /// Drops the storage (for example after a sharded unit is freed).
  void unbind() {
    if (var_.defined()) var_ = Var<T, D>(Tensor<T, D>(), var_.requires_grad());
  }

  /// Whether the optimizer's weight decay applies to this parameter: PyTorch's parameter group
  /// with weight_decay=0 where not (nanoGPT and Hugging Face exempt biases and norms;
  /// decay_matrices_only() does). The engine reads it when it builds its optimizers: set it
  /// before constructing the engine.
  bool has_weight_decay() const { return weight_decay_; }
  void set_weight_decay(bool on) { weight_decay_ = on; }

  /// Frozen parameters get no gradient.
  bool requires_grad() const { return var_.defined() && var_.requires_grad(); }
  void set_requires_grad(bool on) {
    if (!var_.defined()) var_ = Var<T, D>(Tensor<T, D>(), on);
    var_.node()->requires_grad = on;
  }

 private:
  [[noreturn]] void throw_unbound() const {
    const std::string name = name_.empty() ? std::string("<unnamed>") : name_;
    // A sharded unit's parameter between gathers: the unit's buffer says which unit, and that it
    // is not gathered.
    const Tensor<T, D>& value = var_.defined() ? var_.value() : Tensor<T, D>();
    const std::string what = value.defined() ? value.storage()->view_description(value.offset()) : "";
    if (!what.empty())
      detail::throw_error("parameter '", name, "' of shape ", shape_, " has no storage here: it is ", what,
                          ". Use it only inside the strategy's forward and backward, where its unit is gathered");
    detail::throw_error("parameter '", name, "' of shape ", shape_,
                        " has no storage here: bind it (FlatParameters), or use it only while its unit is gathered "
                        "(inside the strategy's forward and backward)");
  }
  Shape shape_;
  ParameterInit init_;
  Var<T, D> var_;
  std::string name_;
  bool weight_decay_ = true;
};

}  // namespace polyshard
