// Shapes and strides: up to six dimensions held inline, so making a view never allocates.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <sstream>
#include <string>

#include "polyshard/core/error.hpp"

namespace polyshard {

/// A list of up to `max_rank` extents (or strides), stored inline.
class Shape {
 public:
  static constexpr int max_rank = 6;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) {
    POLYSHARD_CHECK(static_cast<int>(dims.size()) <= max_rank, "Shape: at most ", max_rank,
                    " dimensions, got ", dims.size());
    for (std::int64_t d : dims) push_back(d);
  }
  explicit Shape(std::span<const std::int64_t> dims) {
    POLYSHARD_CHECK(static_cast<int>(dims.size()) <= max_rank, "Shape: at most ", max_rank,
                    " dimensions, got ", dims.size());
    for (std::int64_t d : dims) push_back(d);
  }

  int rank() const { return rank_; }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  /// Extent counted from the end: back(0) is the last dimension.
  std::int64_t back(int i = 0) const { return dims_[static_cast<std::size_t>(rank_ - 1 - i)]; }

  void push_back(std::int64_t d) {
    POLYSHARD_CHECK(rank_ < max_rank, "Shape: at most ", max_rank, " dimensions");
    dims_[static_cast<std::size_t>(rank_++)] = d;
  }

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }

  /// Product of the dimensions before the last `trailing` ones (the "rows" of a batched op).
  std::int64_t leading(int trailing = 1) const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_ - trailing; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }

  const std::int64_t* begin() const { return dims_.data(); }
  const std::int64_t* end() const { return dims_.data() + rank_; }

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
  }

  std::string str() const {
    std::ostringstream out;
    out << *this;
    return out.str();
  }
  friend std::ostream& operator<<(std::ostream& out, const Shape& s) {
    out << '(';
    for (int i = 0; i < s.rank_; ++i) out << (i ? ", " : "") << s[i];
    if (s.rank_ == 1) out << ',';
    return out << ')';
  }

  /// Row-major strides of a contiguous tensor of this shape.
  Shape contiguous_strides() const {
    Shape s;
    s.rank_ = rank_;
    std::int64_t stride = 1;
    for (int i = rank_ - 1; i >= 0; --i) {
      s.dims_[static_cast<std::size_t>(i)] = stride;
      stride *= dims_[static_cast<std::size_t>(i)];
    }
    return s;
  }

 private:
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
};

}  // namespace polyshard
