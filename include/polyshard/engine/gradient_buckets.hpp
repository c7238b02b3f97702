// Gradient buckets: a unit's flat gradient buffer cut into ranges of whole parameters, each
// reduced as soon as backward has finished every parameter in it, while backward goes on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/policy/config.hpp"

namespace polyshard {

/// Elements [begin, end) of a unit's flat buffer, holding parameters [first, last) of its
/// layout (in offset order).
struct GradientBucket {
  std::int64_t begin = 0, end = 0;
  std::size_t first = 0, last = 0;
};

/// Cuts a unit into buckets: whole parameters taken from the end of the buffer towards its
/// start (the order in which backward finishes the parameters of a model that registers them in
/// forward order, as DDP fills its buckets), each bucket at most `cap` elements unless one
/// parameter alone is larger; the padding after the last parameter joins the first bucket.
/// `offsets` and `sizes` are the parameters' in offset order; cap <= 0: the unit is one bucket.
/// Bucket 0 is the one backward finishes first; the engine launches them in index order.
inline std::vector<GradientBucket> plan_gradient_buckets(const std::vector<std::int64_t>& offsets,
                                                         const std::vector<std::int64_t>& sizes, std::int64_t padded,
                                                         std::int64_t cap) {
  const std::size_t n = offsets.size();
  if (cap <= 0 || n == 0) return {GradientBucket{0, padded, 0, n}};
  std::vector<GradientBucket> buckets;
  std::size_t last = n;
  std::int64_t end = padded;
  while (last > 0) {
    std::size_t first = last - 1;
    while (first > 0 && offsets[last - 1] + sizes[last - 1] - offsets[first - 1] <= cap) --first;
    const std::int64_t begin = first == 0 ? 0 : offsets[first];
    buckets.push_back({begin, end, first, last});
    end = begin;
    last = first;
  }
  return buckets;
}

/// The most elements of one gradient bucket, 0 for one bucket a unit: the smallest of the caps
/// the config sets (Engine has filled the strategy's reference cap in where it sets none, see
/// with_reference_defaults): bucket_cap_mb MiB of the reduce type (<= 0: no cap from it),
/// reduce_bucket_size elements, and reduce_buffer_size elements (0: every parameter alone, a cap
/// of one element).
inline std::int64_t gradient_bucket_elements(const StrategyConfig& c, std::size_t reduce_bytes) {
  POLYSHARD_CHECK(!c.reduce_bucket_size || *c.reduce_bucket_size > 0, "StrategyConfig::reduce_bucket_size = ",
                  c.reduce_bucket_size.value_or(0), ": must be a positive number of elements (DeepSpeed's default: ",
                  lightning_reduce_bucket_size, ")");
  POLYSHARD_CHECK(!c.reduce_buffer_size || *c.reduce_buffer_size >= 0, "StrategyConfig::reduce_buffer_size = ",
                  c.reduce_buffer_size.value_or(0), ": must be a number of elements, or 0 to reduce every parameter ",
                  "alone (FairScale's default: ", fairscale_reduce_buffer_size, ")");
  std::int64_t cap = 0;
  const auto bound = [&cap](std::int64_t elements) { cap = cap == 0 ? elements : std::min(cap, elements); };
  if (c.bucket_cap_mb && *c.bucket_cap_mb > 0)
    bound(std::max<std::int64_t>(1, static_cast<std::int64_t>(*c.bucket_cap_mb * 1024 * 1024 /
                                                                static_cast<double>(reduce_bytes))));
  if (c.reduce_bucket_size) bound(*c.reduce_bucket_size);
  if (c.reduce_buffer_size) bound(std::max<std::int64_t>(1, *c.reduce_buffer_size));
  return cap;
}

/// Which buckets of one unit backward has finished, and which of them are launched: a bucket
/// is launched once every parameter in it that takes a gradient is final, and only after every
/// bucket before it, so that every rank issues the same collectives in the same order.
class BucketProgress {
 public:
  /// Arms the count for a new backward: `needs[i]` says whether parameter i will be told final
  /// (it takes a gradient: trainable and not empty).
  void arm(const std::vector<GradientBucket>& buckets, const std::vector<bool>& needs) {
    waiting_.assign(buckets.size(), 0);
    bucket_of_.assign(needs.size(), 0);
    for (std::size_t b = 0; b < buckets.size(); ++b)
      for (std::size_t i = buckets[b].first; i < buckets[b].last; ++i) {
        bucket_of_[i] = b;
        if (needs[i]) ++waiting_[b];
      }
    done_.assign(needs.size(), false);
    next_ = 0;
    armed_ = true;
  }
  bool armed() const { return armed_; }
  /// Parameter `i` is final (once: a second report of the same parameter is ignored).
  void final(std::size_t i) {
    if (!armed_ || i >= done_.size() || done_[i]) return;
    done_[i] = true;
    --waiting_[bucket_of_[i]];
  }
  /// The next bucket to launch, if it is complete (else waiting_.size()).
  std::size_t launchable() const { return next_ < waiting_.size() && waiting_[next_] == 0 ? next_ : waiting_.size(); }
  /// The next bucket not launched yet (waiting_.size() when all are).
  std::size_t next() const { return next_; }
  void launched() { ++next_; }
  /// Ends this backward's count: later reports are ignored until the next arm().
  void disarm() { armed_ = false; }

 private:
  std::vector<int> waiting_;          // per bucket: parameters not final yet
  std::vector<std::size_t> bucket_of_;
  std::vector<bool> done_;
  std::size_t next_ = 0;
  bool armed_ = false;
};

}  // namespace polyshard
