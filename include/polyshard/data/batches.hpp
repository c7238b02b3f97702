// Deterministic batches: the global batch of a step is a pure function of (seed, step), and
// each rank takes its own contiguous rows of it, so any world size trains on the same data.
#pragma once

#include "polyshard/data/text_dataset.hpp"
#include "polyshard/core/counter_rng.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// One rank's rows of a step's global batch.
struct Batch {
  Tensor<std::int32_t> inputs;   // (rows, T)
  Tensor<std::int32_t> targets;  // (rows, T): inputs shifted by one token
};

/// Rows [begin, end) of global batch `global_rows` for a rank: rank r of N takes an equal
/// share, the first (global_rows % N) ranks one row more.
struct RowRange {
  std::int64_t begin, end;
};
inline RowRange rank_rows(std::int64_t global_rows, int rank, int world_size) {
  POLYSHARD_CHECK(world_size >= 1 && 0 <= rank && rank < world_size, "rank_rows: rank ", rank,
                  " is not in a world of size ", world_size);
  const std::int64_t base = global_rows / world_size, extra = global_rows % world_size;
  const std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

/// Draws the windows of the global batch of `step` and returns `rank`'s rows of it.
/// Window starts come from a counter-based hash of (seed, step, row), uniform over the
/// dataset's windows; no generator state is carried between steps.
class BatchSampler {
 public:
  BatchSampler(const TextDataset& data, std::int64_t seq_len, std::int64_t global_batch, std::uint64_t seed)
      : data_(data), seq_len_(seq_len), global_batch_(global_batch), seed_(seed), windows_(data.windows(seq_len)) {
    POLYSHARD_CHECK(global_batch >= 1, "BatchSampler: batch must be at least 1, got ", global_batch);
  }

  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t global_batch() const { return global_batch_; }

  /// Start of row `row` of the global batch of `step`.
  std::int64_t window_start(std::int64_t step, std::int64_t row) const {
    const std::uint64_t h = counter_bits(splitmix64(seed_) ^ static_cast<std::uint64_t>(step),
                                         static_cast<std::uint64_t>(row));
    return static_cast<std::int64_t>(h % static_cast<std::uint64_t>(windows_));
  }

  Batch batch(std::int64_t step, int rank = 0, int world_size = 1) const {
    const RowRange rows = rank_rows(global_batch_, rank, world_size);
    const std::int64_t n = rows.end - rows.begin;
    Batch b{Tensor<std::int32_t>::empty({n, seq_len_}), Tensor<std::int32_t>::empty({n, seq_len_})};
    const std::int32_t* tokens = data_.tokens().data();
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t start = window_start(step, rows.begin + r);
      std::copy_n(tokens + start, seq_len_, b.inputs.data() + r * seq_len_);
      std::copy_n(tokens + start + 1, seq_len_, b.targets.data() + r * seq_len_);
    }
    return b;
  }

 private:
  const TextDataset& data_;
  std::int64_t seq_len_, global_batch_;
  std::uint64_t seed_;
  std::int64_t windows_;
};

}  // namespace polyshard
