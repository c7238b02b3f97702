// Umbrella header for safetensors files: header validation, reader, writer.
#pragma once

#include "polyshard/io/safetensors_header.hpp"
#include "polyshard/io/safetensors_reader.hpp"
#include "polyshard/io/safetensors_writer.hpp"
