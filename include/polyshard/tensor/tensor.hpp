// The tensor: an element type, a device, a shape and strides over shared storage.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "polyshard/core/device.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/core/memory_tracker.hpp"
#include "polyshard/tensor/shape.hpp"
#include "polyshard/tensor/storage.hpp"

namespace polyshard {

/// A strided view over reference-counted storage. Copying a Tensor copies the view, not the
/// elements; views (reshape, slice, transpose, flat_view) share storage with their source.
/// Shapes are row-major; only `transpose()` makes a tensor non-contiguous.
template <Element T, Device D = Cpu>
class Tensor {
 public:
  using value_type = T;
  using device_type = D;

  Tensor() = default;

  /// Uninitialized elements, counted under `category` (by default the thread's current one).
  static Tensor empty(const Shape& shape, MemoryCategory category = current_memory_category()) {
    Tensor t;
    t.storage_ = std::make_shared<Storage<T, D>>(static_cast<std::size_t>(shape.numel()), category);
    t.shape_ = shape;
    t.strides_ = shape.contiguous_strides();
    return t;
  }
  /// A tensor whose storage holds no elements until storage()->materialize() (as after
  /// release()): shape and views exist, memory does not.
  static Tensor unmaterialized(const Shape& shape, MemoryCategory category = current_memory_category()) {
    Tensor t;
    t.storage_ = std::make_shared<Storage<T, D>>(static_cast<std::size_t>(shape.numel()), category, nullptr);
    t.shape_ = shape;
    t.strides_ = shape.contiguous_strides();
    return t;
  }
  static Tensor full(const Shape& shape, T value, MemoryCategory category = current_memory_category()) {
    Tensor t = empty(shape, category);
    t.fill(value);
    return t;
  }
  static Tensor zeros(const Shape& shape, MemoryCategory category = current_memory_category()) {
    return full(shape, T(0), category);
  }
  /// A host tensor holding a copy of `values` (on a device: to_device(Tensor<T>::from(...))).
  static Tensor from(const Shape& shape, std::span<const T> values,
                     MemoryCategory category = current_memory_category()) {
    static_assert(std::same_as<D, Cpu>, "Tensor::from copies host values: build a host tensor and copy it to the device");
    POLYSHARD_CHECK(static_cast<std::int64_t>(values.size()) == shape.numel(), "Tensor::from: shape ",
                    shape, " holds ", shape.numel(), " elements but ", values.size(), " were given");
    Tensor t = empty(shape, category);
    std::copy(values.begin(), values.end(), t.data());
    return t;
  }
  static Tensor from(const Shape& shape, std::initializer_list<T> values) {
    return from(shape, std::span<const T>(values.begin(), values.size()));
  }
  /// A view of memory the caller owns and keeps alive; nothing is counted or freed.
  static Tensor wrap(T* data, const Shape& shape) {
    Tensor t;
    t.storage_ = std::make_shared<Storage<T, D>>(data, static_cast<std::size_t>(shape.numel()));
    t.shape_ = shape;
    t.strides_ = shape.contiguous_strides();
    return t;
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int rank() const { return shape_.rank(); }
  std::int64_t size(int dim) const { return shape_[dim < 0 ? dim + rank() : dim]; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(T); }
  std::int64_t offset() const { return offset_; }
  const std::shared_ptr<Storage<T, D>>& storage() const { return storage_; }

  /// The first element, in D's memory (a device pointer for Cuda). An error when the storage's
  /// elements were released (a sharded strategy freed the unit this tensor views): a pointer
  /// computed from nothing would read whatever the allocator put there since.
  T* data() const {
    if (!storage_) return nullptr;
    T* const base = storage_->data();
    if (base) return base + offset_;
    if (numel() > 0) [[unlikely]]
      throw_released();
    return nullptr;
  }
  std::span<T> span() const {
    POLYSHARD_CHECK(is_contiguous(), "Tensor::span: tensor of shape ", shape_, " is not contiguous");
    return {data(), static_cast<std::size_t>(numel())};
  }

  bool is_contiguous() const { return strides_ == shape_.contiguous_strides() || numel() <= 1; }

  /// True when this tensor is the transpose of a contiguous one (its last two dims swapped).
  bool is_transposed_contiguous() const {
    if (rank() < 2) return false;
    Shape s = shape_;
    std::swap(s[rank() - 1], s[rank() - 2]);
    Shape expected = s.contiguous_strides();
    std::swap(expected[rank() - 1], expected[rank() - 2]);
    return strides_ == expected;
  }

  /// Same elements, new shape; the tensor must be contiguous. One extent may be -1.
  Tensor reshape(Shape shape) const {
    POLYSHARD_CHECK(is_contiguous(), "reshape: tensor of shape ", shape_,
                    " is not contiguous (call contiguous() first)");
    int infer = -1;
    std::int64_t known = 1;
    for (int i = 0; i < shape.rank(); ++i) {
      if (shape[i] == -1) {
        POLYSHARD_CHECK(infer < 0, "reshape: more than one -1 in ", shape);
        infer = i;
      } else {
        known *= shape[i];
      }
    }
    if (infer >= 0) {
      POLYSHARD_CHECK(known > 0 && numel() % known == 0, "reshape: cannot reshape ", shape_, " to ", shape);
      shape[infer] = numel() / known;
    }
    POLYSHARD_CHECK(shape.numel() == numel(), "reshape: cannot reshape ", shape_, " (", numel(),
                    " elements) to ", shape, " (", shape.numel(), " elements)");
    Tensor t = *this;
    t.shape_ = shape;
    t.strides_ = shape.contiguous_strides();
    return t;
  }

  /// Rows [begin, end) along the first dimension.
  Tensor slice(std::int64_t begin, std::int64_t end) const {
    POLYSHARD_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice: [", begin, ", ",
                    end, ") is out of range for shape ", shape_);
    Tensor t = *this;
    t.offset_ += begin * strides_[0];
    t.shape_[0] = end - begin;
    return t;
  }

  /// Elements [begin, begin + count) of a contiguous tensor, as a 1-D view.
  Tensor flat_view(std::int64_t begin, std::int64_t count) const {
    POLYSHARD_CHECK(is_contiguous(), "flat_view: tensor of shape ", shape_, " is not contiguous");
    POLYSHARD_CHECK(0 <= begin && 0 <= count && begin + count <= numel(), "flat_view: [", begin, ", ",
                    begin + count, ") is out of range for ", numel(), " elements");
    Tensor t = *this;
    t.offset_ += begin;
    t.shape_ = Shape{count};
    t.strides_ = t.shape_.contiguous_strides();
    return t;
  }

  /// Swaps the last two dimensions (a view; the result is not contiguous).
  Tensor transpose() const {
    POLYSHARD_CHECK(rank() >= 2, "transpose: needs at least 2 dimensions, got shape ", shape_);
    Tensor t = *this;
    std::swap(t.shape_[rank() - 1], t.shape_[rank() - 2]);
    std::swap(t.strides_[rank() - 1], t.strides_[rank() - 2]);
    return t;
  }

  /// This tensor if contiguous, else a contiguous copy.
  Tensor contiguous() const {
    if (is_contiguous()) return *this;
    Tensor out = empty(shape_);
    copy_into(out.data());
    return out;
  }

  /// A contiguous copy with its own storage.
  Tensor clone(MemoryCategory category = current_memory_category()) const {
    Tensor out = empty(shape_, category);
    copy_into(out.data());
    return out;
  }

  /// Copies `src` (same shape, any strides) into this tensor's elements.
  void copy_from(const Tensor& src) const {
    POLYSHARD_CHECK(src.shape() == shape_, "copy_from: shapes ", src.shape(), " and ", shape_, " differ");
    POLYSHARD_CHECK(is_contiguous(), "copy_from: destination of shape ", shape_, " is not contiguous");
    src.copy_into(data());
  }

  void fill(T value) const {
    POLYSHARD_CHECK(is_contiguous(), "fill: tensor of shape ", shape_, " is not contiguous");
    Storage<T, D>::fill(data(), numel(), value);
  }

  /// Element at a multi-index, for tests and small host-side code (host tensors only).
  template <class... I>
    requires std::same_as<D, Cpu>
  T& at(I... index) const {
    POLYSHARD_CHECK(sizeof...(I) == static_cast<std::size_t>(rank()), "at: ", sizeof...(I),
                    " indices for shape ", shape_);
    std::int64_t idx[] = {static_cast<std::int64_t>(index)...};
    std::int64_t off = 0;
    for (int i = 0; i < rank(); ++i) {
      POLYSHARD_CHECK(0 <= idx[i] && idx[i] < shape_[i], "at: index ", idx[i], " out of range in dim ", i,
                      " of shape ", shape_);
      off += idx[i] * strides_[i];
    }
    return data()[off];
  }

  /// All elements in row-major order, copied to a vector.
  /// All elements in row-major order, copied to a host vector (from a device: waits for them).
  std::vector<T> to_vector() const {
    std::vector<T> v(static_cast<std::size_t>(numel()));
    const Tensor c = contiguous();
    Storage<T, D>::copy_to_host(v.data(), c.data(), numel());
    return v;
  }

 private:
  [[noreturn]] void throw_released() const {
    if (!storage_->release_reason().empty())
      detail::throw_error("Tensor of shape ", shape_, ": its elements were released: ", storage_->release_reason());
    const std::string what = storage_->view_description(offset_);
    if (!what.empty())
      detail::throw_error("Tensor of shape ", shape_, " views ", what, ": its elements were released. Read it inside "
                          "the forward or backward that gathers the unit, or keep a clone() taken there");
    detail::throw_error("Tensor of shape ", shape_, ": its elements were released. It views a buffer that a "
                        "sharded strategy freed, such as a parameter taken while its unit was gathered and read "
                        "after the unit was freed; read it inside the forward or backward that gathers the unit, "
                        "or keep a clone() taken there");
  }

  /// Copies this view's elements, row-major, to contiguous memory of the same device.
  void copy_into(T* out) const { Storage<T, D>::copy_view(out, data(), shape_, strides_, is_contiguous()); }

  std::shared_ptr<Storage<T, D>> storage_;
  std::int64_t offset_ = 0;
  Shape shape_;
  Shape strides_;
};

/// Throws an error naming `op` and both shapes unless they are equal.
inline void check_same_shape(const char* op, const Shape& a, const Shape& b) {
  POLYSHARD_CHECK(a == b, op, ": shape mismatch between ", a, " and ", b);
}

/// dst := src, `src` and `dst` in the memory of any two devices (one of them the host when
/// they differ); dst contiguous, of src's shape. A transfer waits until it is done.
/// (Device code includes the device's storage header: polyshard/tensor/cuda/storage.hpp for Cuda.)
template <Element T, Device From, Device To>
void copy_across(const Tensor<T, From>& src, const Tensor<T, To>& dst) {
  if constexpr (std::same_as<From, To>) {
    dst.copy_from(src);
  } else {
    static_assert(std::same_as<From, Cpu> || std::same_as<To, Cpu>, "copy_across: between two devices, go through the host");
    check_same_shape("copy_across", src.shape(), dst.shape());
    POLYSHARD_CHECK(dst.is_contiguous(), "copy_across: destination of shape ", dst.shape(), " is not contiguous");
    const Tensor<T, From> c = src.contiguous();
    if constexpr (std::same_as<From, Cpu>) Storage<T, To>::copy_from_host(dst.data(), c.data(), c.numel());
    else Storage<T, From>::copy_to_host(dst.data(), c.data(), c.numel());
  }
}

/// An uninitialized host tensor whose elements will move to or from device D: from D's staging
/// allocator (pinned memory for CUDA), so that its transfers run at the link's full speed.
template <Element T, Device D>
Tensor<T, Cpu> host_staging_tensor(const Shape& shape, MemoryCategory category = current_memory_category()) {
  HostAllocatorScope staging(Storage<T, D>::staging_allocator());
  return Tensor<T, Cpu>::empty(shape, category);
}

/// `host` on device D: the tensor itself for the host, else a contiguous copy in D's memory.
/// (Device code includes D's storage header, polyshard/tensor/cuda/storage.hpp for Cuda.)
template <Device D, Element T>
Tensor<T, D> on_device(const Tensor<T, Cpu>& host, MemoryCategory category = current_memory_category()) {
  if constexpr (std::same_as<D, Cpu>) {
    return host;
  } else {
    auto out = Tensor<T, D>::empty(host.shape(), category);
    copy_across(host, out);
    return out;
  }
}

}  // namespace polyshard
