// A module's state that is not trained: a running statistic, a step counter, a fixed table.
// PyTorch's register_buffer: named like a parameter ("norm.running_mean"), never given a
// gradient nor sharded, kept whole on every rank, and saved with the state dict when persistent.
#pragma once

#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// A tensor a module owns outside the autograd graph. Forward may read it and write it (a
/// running mean updated from each batch) through value(), which shares the storage, so a const
/// forward can update it. Under an engine, broadcast_buffers makes every rank start each forward
/// from rank 0's buffers, and Engine::sync_buffers() does so on demand (docs/models.md).
template <Element T, Device D = Cpu>
class Buffer {
 public:
  Buffer() = default;
  /// A buffer of `shape` filled with `fill`; `persistent` ones are part of the state dict.
  Buffer(const Shape& shape, T fill, bool persistent = true)
      : value_(Tensor<T, D>::full(shape, fill, MemoryCategory::Other)), persistent_(persistent) {}

  /// The buffer's contents; writes through it change the buffer (the storage is shared).
  Tensor<T, D> value() const { return value_; }
  const Shape& shape() const { return value_.shape(); }
  std::int64_t numel() const { return value_.numel(); }
  /// Saved in and loaded from state dicts (PyTorch's register_buffer(persistent=True)).
  bool persistent() const { return persistent_; }

 private:
  Tensor<T, D> value_;
  bool persistent_ = true;
};

namespace detail {
template <class X>
struct is_buffer : std::false_type {};
template <class T, class D>
struct is_buffer<Buffer<T, D>> : std::true_type {
  using device = D;
};
}  // namespace detail

}  // namespace polyshard
