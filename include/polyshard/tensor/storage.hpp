// Reference-counted memory behind tensors: a block from the device's allocator, counted under
// a memory category for as long as it lives; and the device's element copies and fills, which
// Tensor calls so that its views work the same on every device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "polyshard/core/device.hpp"
#include "polyshard/core/dtype.hpp"
#include "polyshard/core/host_allocator.hpp"
#include "polyshard/core/memory_tracker.hpp"
#include "polyshard/tensor/shape.hpp"

namespace polyshard {

template <Element T, Device D>
class Storage;  // primary template: specialized per device

/// Copies between D's memory and page-locked host memory that the device orders among its work
/// while the host goes on (specialized for Cuda in polyshard/tensor/cuda/storage.hpp; the host
/// has nothing to order).
template <Device D>
struct PinnedTransfers;

/// What a storage's views are, for the error of a view read while the elements are released:
/// the owner of a buffer that is freed and gathered again (a sharded unit's parameters) says
/// which of its parameters an element offset falls in and why the elements are gone.
class ViewNames {
 public:
  using Describe = std::function<std::string(std::int64_t offset)>;
  void describe_views(Describe describe) { describe_ = std::move(describe); }
  /// What the view starting at element `offset` is, or "" when the owner did not say.
  std::string view_description(std::int64_t offset) const { return describe_ ? describe_(offset) : std::string(); }
  /// Why the elements are released, and what to do, where the one who released them said (a
  /// checkpoint that moved its input to host memory); "" otherwise. Read before the views' names.
  void set_release_reason(std::string reason) { release_reason_ = std::move(reason); }
  const std::string& release_reason() const { return release_reason_; }

 private:
  Describe describe_;
  std::string release_reason_;
};

/// Host storage from the thread's current caching allocator (current_host_allocator(): pageable
/// memory unless a HostAllocatorScope names another). Elements are left uninitialized.
template <Element T>
class Storage<T, Cpu> : public ViewNames {
 public:
  Storage(std::size_t numel, MemoryCategory category)
      : numel_(numel),
        category_(category),
        tracker_(&current_memory_tracker()),
        allocator_(&current_host_allocator()) {
    data_ = static_cast<T*>(allocator_->allocate(bytes()));
    tracker_->add(category_, static_cast<std::int64_t>(bytes()));
  }
  /// No elements yet: as after release(), until materialize() allocates them (from the
  /// allocator current now). A sharded strategy builds a unit's whole buffers this way, so
  /// that no rank ever holds them at start-up.
  Storage(std::size_t numel, MemoryCategory category, std::nullptr_t)
      : numel_(numel),
        category_(category),
        tracker_(&current_memory_tracker()),
        allocator_(&current_host_allocator()) {}
  /// Wraps memory the caller owns; nothing is counted or freed.
  Storage(T* external, std::size_t numel)
      : data_(external), numel_(numel), category_(MemoryCategory::Other), tracker_(nullptr), owned_(false) {}

  ~Storage() {
    if (!owned_ || !data_) return;
    allocator_->deallocate(data_, bytes());
    tracker_->sub(category_, static_cast<std::int64_t>(bytes()));
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  T* data() const { return data_; }
  /// False between release() and materialize(): the views of this storage have no elements.
  bool materialized() const { return data_ != nullptr || numel_ == 0; }

  /// Gives the elements back to the allocator while every view of this storage stays valid as
  /// an object: how a sharded strategy frees a gathered unit without unbinding its parameters.
  void release() {
    if (!owned_ || !data_) return;
    allocator_->deallocate(data_, bytes());
    tracker_->sub(category_, static_cast<std::int64_t>(bytes()));
    data_ = nullptr;
  }
  /// Allocates the elements again (uninitialized) after release(), from the allocator they
  /// came from at construction; counted in the current tracker.
  void materialize() {
    if (!owned_ || data_ || numel_ == 0) return;
    tracker_ = &current_memory_tracker();
    data_ = static_cast<T*>(allocator_->allocate(bytes()));
    tracker_->add(category_, static_cast<std::int64_t>(bytes()));
  }
  std::size_t numel() const { return numel_; }
  std::size_t bytes() const { return numel_ * sizeof(T); }
  MemoryCategory category() const { return category_; }

  /// Copies the view (shape, strides) starting at `src` into contiguous `out`, row-major.
  static void copy_view(T* out, const T* src, const Shape& shape, const Shape& strides, bool contiguous) {
    const std::int64_t n = shape.numel();
    if (contiguous) {
      std::copy_n(src, n, out);
      return;
    }
    // Walk the index space in row-major order with an odometer.
    std::int64_t idx[Shape::max_rank] = {};
    for (std::int64_t k = 0; k < n; ++k) {
      std::int64_t off = 0;
      for (int i = 0; i < shape.rank(); ++i) off += idx[i] * strides[i];
      out[k] = src[off];
      for (int i = shape.rank() - 1; i >= 0; --i) {
        if (++idx[i] < shape[i]) break;
        idx[i] = 0;
      }
    }
  }
  static void fill(T* out, std::int64_t n, T value) { std::fill_n(out, n, value); }
  /// The host allocator whose memory this device copies fastest to and from: for the host
  /// itself, the pageable one.
  static CachingHostAllocator& staging_allocator() { return CachingHostAllocator::instance(); }
  /// Copies `n` elements from this device's memory to host memory.
  static void copy_to_host(T* host, const T* src, std::int64_t n) { std::copy_n(src, n, host); }
  /// Copies `n` elements from host memory into this device's memory.
  static void copy_from_host(T* dst, const T* host, std::int64_t n) { std::copy_n(host, n, dst); }
  /// Waits for everything this device was asked to do: the host computes as it is asked.
  static void synchronize_device() {}

 private:
  T* data_ = nullptr;
  std::size_t numel_;
  MemoryCategory category_;
  MemoryTracker* tracker_;
  CachingHostAllocator* allocator_ = nullptr;
  bool owned_ = true;
};

}  // namespace polyshard
