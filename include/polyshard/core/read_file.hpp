// A whole file read into memory, with errors that name the file and who was reading it.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "polyshard/core/error.hpp"

namespace polyshard {

/// The bytes of `path`. `what` names the reader in errors ("token file: cannot open 'x.bin'").
inline std::string read_file(const std::filesystem::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  POLYSHARD_CHECK(in.good(), what, ": cannot open '", path.string(), "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  POLYSHARD_CHECK(!in.bad(), what, ": error while reading '", path.string(), "'");
  return bytes;
}

}  // namespace polyshard
