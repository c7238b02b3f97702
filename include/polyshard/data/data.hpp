// Umbrella header of the data layer.
#pragma once

#include "polyshard/data/batches.hpp"
#include "polyshard/data/builtin_corpus.hpp"
#include "polyshard/data/byte_tokenizer.hpp"
#include "polyshard/data/text_dataset.hpp"
#include "polyshard/data/token_file.hpp"
