// The data a polyshard-train run reads: its training set and, with --val-data, a validation set.
#pragma once

#include <optional>

#include "polyshard/data/text_dataset.hpp"

namespace train {

struct Datasets {
  polyshard::TextDataset train;
  std::optional<polyshard::TextDataset> validation;  // --val-data
};

}  // namespace train
