// Flat parameter storage: every parameter of a module tree is a view into one buffer of values
// and one of gradients, so optimizers, collectives and checkpoints see a single span, and a
// shard is just a range of it.
#pragma once

#include <string>
#include <vector>

#include "polyshard/nn/init.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

/// Owns the flat buffers of a module tree and binds each parameter to its slice.
/// The module must stay where it is (not moved) while bound: entries point into it.
template <FloatElement T, Device D = Cpu>
class FlatParameters {
 public:
  /// Where one parameter lives in the flat buffers.
  struct Entry {
    std::string name;
    std::int64_t offset;
    Shape shape;
    ParameterInit init;
    Parameter<T, D>* parameter;
    std::int64_t numel() const { return shape.numel(); }
  };

  /// Lays out the parameters of `module` in visiting order, padding the total to a multiple
  /// of `pad_to` (the world size, when the buffers will be split into equal shards).
  template <Module M>
  explicit FlatParameters(M& module, std::int64_t pad_to = 1) {
    POLYSHARD_CHECK(pad_to >= 1, "FlatParameters: pad_to must be at least 1, got ", pad_to);
    visit_parameters(module, [&](const std::string& name, Parameter<T, D>& p) {
      entries_.push_back(Entry{name, numel_, p.shape(), p.init(), &p});
      numel_ += p.numel();
    });
    const std::int64_t padded = (numel_ + pad_to - 1) / pad_to * pad_to;
    values_ = Tensor<T, D>::zeros({padded}, MemoryCategory::Parameters);
    grads_ = Tensor<T, D>::zeros({padded}, MemoryCategory::Gradients);
    for (Entry& e : entries_)
      e.parameter->bind(e.name, values_.flat_view(e.offset, e.numel()).reshape(e.shape),
                        grads_.flat_view(e.offset, e.numel()).reshape(e.shape));
  }
  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;

  /// Fills every parameter by its ParameterInit, as a function of (seed, name, index) only.
  /// On a device the values are drawn on the host and copied, so they are the same bits.
  void initialize(std::uint64_t seed) {
    auto draw = [&](const Tensor<T>& host) {
      for (const Entry& e : entries_)
        initialize_slice(host.flat_view(e.offset, e.numel()).span(), 0, e.init, e.name, seed);
    };
    if constexpr (std::same_as<D, Cpu>) {
      draw(values_);
    } else {
      const auto host = Tensor<T>::zeros({values_.numel()});
      draw(host);
      Storage<T, D>::copy_from_host(values_.data(), host.data(), host.numel());
    }
  }

  /// Number of parameters, without padding.
  std::int64_t numel() const { return numel_; }
  /// Length of the buffers, padding included.
  std::int64_t padded_numel() const { return values_.numel(); }
  const Tensor<T, D>& values() const { return values_; }
  const Tensor<T, D>& grads() const { return grads_; }
  const std::vector<Entry>& entries() const { return entries_; }

  /// Forgets every gradient. With `set_to_none` nothing is written now: the next backward
  /// overwrites instead of adding. Otherwise the gradient buffer is zero-filled.
  void zero_grad(bool set_to_none = true) {
    for (const Entry& e : entries_) e.parameter->leaf().zero_grad();
    if (!set_to_none) {
      grads_.fill(T(0));
      for (const Entry& e : entries_) e.parameter->leaf().node()->has_grad = true;
    }
  }

  /// Zeroes the gradient slices that no backward has written since the last zero_grad
  /// (parameters unused by the loss, frozen ones), so the whole buffer can be read as one.
  void settle_grads() {
    for (const Entry& e : entries_)
      if (!e.parameter->leaf().node()->has_grad) grads_.flat_view(e.offset, e.numel()).fill(T(0));
  }

 private:
  std::vector<Entry> entries_;
  std::int64_t numel_ = 0;
  Tensor<T, D> values_;
  Tensor<T, D> grads_;
};

}  // namespace polyshard
