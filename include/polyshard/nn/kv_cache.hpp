// The keys and values a decoder has computed for the positions it has seen, one pair of buffers
// per attention layer, so that generating a token computes one new position, not the prefix.
#pragma once

#include <cstddef>
#include <vector>

#include "polyshard/autograd/grad_mode.hpp"
#include "polyshard/autograd/variable.hpp"
#include "polyshard/tensor/ops/cached_attention.hpp"

namespace polyshard {

/// Host buffers (B, capacity, kv_width) of keys and values for each attention layer. A model's
/// cached forward attends with `length()` as the number of past positions, then advance()s it.
template <FloatElement T>
class KvCache {
 public:
  /// `kv_width`: n_kv_head * head_dim, the width of one position's keys (or values).
  KvCache(std::int64_t layers, std::int64_t batch, std::int64_t capacity, std::int64_t kv_width)
      : capacity_(capacity) {
    POLYSHARD_CHECK(layers >= 0 && batch >= 1 && capacity >= 1 && kv_width >= 1, "KvCache: layers ", layers,
                    ", batch ", batch, ", capacity ", capacity, " and width ", kv_width,
                    " must be positive (layers may be 0)");
    for (std::int64_t i = 0; i < layers; ++i)
      layers_.push_back({Tensor<T>::zeros({batch, capacity, kv_width}), Tensor<T>::zeros({batch, capacity, kv_width})});
  }

  std::int64_t length() const { return length_; }      ///< positions cached so far
  std::int64_t capacity() const { return capacity_; }  ///< positions the buffers hold
  std::size_t layers() const { return layers_.size(); }
  const Tensor<T>& keys(std::size_t layer) const { return at(layer).k; }
  const Tensor<T>& values(std::size_t layer) const { return at(layer).v; }

  /// Called by a model after every layer has cached `n` new positions.
  void advance(std::int64_t n) {
    POLYSHARD_CHECK(n >= 0 && length_ + n <= capacity_, "KvCache: ", length_, " cached and ", n,
                    " new positions exceed the capacity of ", capacity_);
    length_ += n;
  }

 private:
  struct Layer {
    Tensor<T> k, v;
  };
  const Layer& at(std::size_t layer) const {
    POLYSHARD_CHECK(layer < layers_.size(), "KvCache: layer ", layer, " of a cache of ", layers_.size(), " layers");
    return layers_[layer];
  }
  std::vector<Layer> layers_;
  std::int64_t capacity_;
  std::int64_t length_ = 0;
};

namespace detail {
inline void check_generating(const char* op) {
  POLYSHARD_CHECK(!grad_enabled(), op,
                  " has no backward: a cached forward is for generation, under a NoGradGuard (generate() holds one)");
}
}  // namespace detail

/// Causal attention of new positions over `cache`'s layer `layer` (cached_attention_forward on
/// activations), after appending their keys and values; the positions follow cache.length().
/// q: (B, T, n_head hd); k, v: (B, T, n_kv_head hd). Forward only: no gradient flows through it.
template <FloatElement T>
Var<T> attend_cached(const Var<T>& q, const Var<T>& k, const Var<T>& v, KvCache<T>& cache, std::size_t layer,
                     int n_head, int n_kv_head) {
  detail::check_generating("attend_cached");
  Tensor<T> out = Tensor<T>::empty(q.shape());
  cached_attention_forward(q.value().contiguous(), k.value().contiguous(), v.value().contiguous(), cache.keys(layer),
                           cache.values(layer), cache.length(), n_head, n_kv_head, out);
  return Var<T>(std::move(out));
}

/// The same over GPT-2's fused projection qkv: (B, T, 3C), laid out [q | k | v].
template <FloatElement T>
Var<T> attend_cached(const Var<T>& qkv, KvCache<T>& cache, std::size_t layer, int n_head) {
  detail::check_generating("attend_cached");
  const Shape& s = qkv.shape();
  POLYSHARD_CHECK(s.rank() == 3 && s[2] % 3 == 0, "attend_cached: qkv must be (B, T, 3C), got shape ", s);
  Tensor<T> out = Tensor<T>::empty({s[0], s[1], s[2] / 3});
  cached_attention_forward(qkv.value(), cache.keys(layer), cache.values(layer), cache.length(), n_head, out);
  return Var<T>(std::move(out));
}

}  // namespace polyshard
