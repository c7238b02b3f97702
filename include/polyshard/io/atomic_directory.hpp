// Crash-safe checkpoint directories: every file is written under a temporary directory, made
// durable, and the directory is then swapped into place in one rename, so a process killed
// mid-save leaves the previous checkpoint whole and loadable.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>

#include <cerrno>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "polyshard/io/atomic_file.hpp"

namespace polyshard {

namespace detail {

// ".<name><tag>", built by appending (GCC 12 warns falsely on the operator+ chain at -O3).
inline std::string hidden_name(const std::filesystem::path& dir, std::string_view tag) {
  std::string out = ".";
  out += dir.filename().string();
  out += tag;
  return out;
}
inline std::string temporary_prefix(const std::filesystem::path& dir) { return hidden_name(dir, ".tmp-"); }
inline std::string previous_prefix(const std::filesystem::path& dir) { return hidden_name(dir, ".old-"); }

/// True while the process that made a temporary named "...-<pid>-<n>" may still be writing it.
inline bool writer_alive(const std::string& suffix) {
  const auto dash = suffix.find('-');
  if (dash == 0 || dash == std::string::npos) return false;
  long pid = 0;
  for (std::size_t i = 0; i < dash; ++i) {
    if (suffix[i] < '0' || suffix[i] > '9' || pid > 100'000'000) return false;
    pid = pid * 10 + (suffix[i] - '0');
  }
  if (pid == ::getpid()) return false;  // ours, from an earlier failed save in this process
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

inline void fsync_tree(const std::filesystem::path& root) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_regular_file()) fsync_file(entry.path());
    else if (entry.is_directory()) fsync_directory(entry.path());
  }
  fsync_directory(root);
}

/// Fault injection for the crash-safety tests: a checkpoint save calls the probe at each named
/// point ("rank file written" by each rank, "rank files written" and "metadata written" by rank
/// 0, "before rename" just before the commit's rename), where a test kills the process. Empty,
/// so nothing happens, unless a test sets it before the save begins.
inline std::function<void(std::string_view point)>& checkpoint_save_probe() {
  static std::function<void(std::string_view)> probe;
  return probe;
}
inline void probe_save(std::string_view point) {
  if (const auto& probe = checkpoint_save_probe()) probe(point);
}

inline std::filesystem::path parent_of(const std::filesystem::path& dir) {
  return dir.has_parent_path() ? dir.parent_path() : std::filesystem::path(".");
}

}  // namespace detail

/// Removes what interrupted saves of checkpoint directory `dir` left beside it: temporary
/// directories ".<name>.tmp-<pid>-<n>" whose writer is no longer running, and, should a save
/// have died between the two renames of the fallback path, restores ".<name>.old-*" to `dir`.
/// Returns the number of entries removed or restored. Called by write_directory_atomically.
inline std::size_t remove_stale_checkpoint_temporaries(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path parent = detail::parent_of(dir);
  if (!fs::is_directory(parent)) return 0;
  const std::string tmp = detail::temporary_prefix(dir), old = detail::previous_prefix(dir);
  std::vector<fs::path> stale, previous;
  for (const auto& entry : fs::directory_iterator(parent)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(tmp) && !detail::writer_alive(name.substr(tmp.size()))) stale.push_back(entry.path());
    else if (name.starts_with(old) && !detail::writer_alive(name.substr(old.size()))) previous.push_back(entry.path());
  }
  std::size_t n = 0;
  for (const auto& p : stale) n += detail::remove_path(p) > 0 ? 1 : 0;
  for (const auto& p : previous) {
    if (fs::exists(dir)) {
      detail::remove_path(p);
    } else if (detail::rename_path(p, dir) != 0) {  // the new one never arrived: keep the old
      detail::throw_errno("cannot restore the previous checkpoint", dir, errno);
    }
    ++n;
  }
  if (n) fsync_directory(parent);
  return n;
}

/// The first half of write_directory_atomically, for a checkpoint whose files several ranks
/// write: checks `dir`'s parent, removes stale temporaries of earlier interrupted saves and
/// creates a fresh temporary directory beside `dir`, which it returns.
inline std::filesystem::path begin_directory_write(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path parent = detail::parent_of(dir);
  POLYSHARD_CHECK(fs::is_directory(parent), "write_directory_atomically: parent directory '", parent.string(),
                  "' of '", dir.string(), "' does not exist");
  POLYSHARD_CHECK(!fs::exists(dir) || fs::is_directory(dir), "write_directory_atomically: '", dir.string(),
                  "' exists and is not a directory");
  remove_stale_checkpoint_temporaries(dir);
  const fs::path tmp = parent / (detail::temporary_prefix(dir) + detail::unique_suffix());
  fs::create_directory(tmp);
  detail::record(FileOperation::Kind::create_directory, tmp);
  return tmp;
}

/// Gives up a write begun by begin_directory_write: removes the temporary, leaves `dir` as it was.
inline void abort_directory_write(const std::filesystem::path& tmp) {
  std::error_code ignored;
  detail::remove_path(tmp, ignored);
}

/// The second half of write_directory_atomically: fsyncs every file and directory under `tmp`,
/// swaps it into place as `dir` with one rename (Linux renameat2 RENAME_EXCHANGE when `dir`
/// exists; a rename pair with recovery elsewhere), fsyncs the parent and removes the previous
/// contents. On failure `dir` is left as it was and `tmp` is removed.
inline void commit_directory_write(const std::filesystem::path& tmp, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path parent = detail::parent_of(dir);
  try {
    detail::fsync_tree(tmp);
  } catch (...) {
    abort_directory_write(tmp);
    throw;
  }
  detail::probe_save("before rename");
  if (!fs::exists(dir)) {
    if (detail::rename_path(tmp, dir) != 0) {
      const int err = errno;
      abort_directory_write(tmp);
      detail::throw_errno("cannot rename checkpoint into place", dir, err);
    }
    fsync_directory(parent);
    return;
  }
#ifdef RENAME_EXCHANGE
  // One step: the name `dir` always refers to a complete checkpoint, old or new.
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    detail::record(FileOperation::Kind::exchange, tmp, dir);
    fsync_directory(parent);
    detail::remove_path(tmp);  // now holds the previous checkpoint
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    const int err = errno;
    abort_directory_write(tmp);
    detail::throw_errno("cannot swap checkpoint into place", dir, err);
  }
#endif
  // Two steps: between them `dir` is missing, and remove_stale_checkpoint_temporaries puts the
  // ".old-" directory back if the process dies there.
  const fs::path old = parent / (detail::previous_prefix(dir) + detail::unique_suffix());
  if (detail::rename_path(dir, old) != 0) {
    const int err = errno;
    abort_directory_write(tmp);
    detail::throw_errno("cannot move previous checkpoint aside", dir, err);
  }
  if (detail::rename_path(tmp, dir) != 0) {
    const int err = errno;
    detail::rename_path(old, dir);
    abort_directory_write(tmp);
    detail::throw_errno("cannot rename checkpoint into place", dir, err);
  }
  fsync_directory(parent);
  detail::remove_path(old);
}

/// Writes checkpoint directory `dir` atomically: removes stale temporaries of earlier
/// interrupted saves, calls `fill(tmp)` to write every file under a fresh temporary directory
/// beside `dir`, then commits it (commit_directory_write). If `fill` throws, `dir` is untouched
/// and the temporary is removed. One writer per checkpoint directory at a time.
/// @param dir   the checkpoint directory to create or replace; its parent must exist
/// @param fill  writes the checkpoint's files into the directory it is given
inline void write_directory_atomically(const std::filesystem::path& dir,
                                       const std::function<void(const std::filesystem::path&)>& fill) {
  const std::filesystem::path tmp = begin_directory_write(dir);
  try {
    fill(tmp);
  } catch (...) {
    abort_directory_write(tmp);
    throw;
  }
  commit_directory_write(tmp, dir);
}

}  // namespace polyshard
