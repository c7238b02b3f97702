// Crash-safe file replacement: write under a temporary name in the same directory, fsync the
// file, rename it over the target, fsync the directory. A reader sees the old file or the new
// one, never a torn one, even if the process or the machine dies mid-write.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <system_error>

#include "polyshard/core/error.hpp"

namespace polyshard {

namespace detail {

[[noreturn]] inline void throw_errno(const std::string& what, const std::filesystem::path& path, int err) {
  throw_error(what, " '", path.string(), "': ", std::strerror(err));
}

/// A unique suffix per process and call, so concurrent writers in one directory never collide.
inline std::string unique_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  return std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

/// Closes a descriptor on scope exit.
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace detail

/// One operation of the file layer (this header and atomic_directory.hpp) that a power loss can
/// undo: every write of a save passes through it. A recorder sees each once it has succeeded, in
/// the order they happened, so that a test can replay every prefix of a save as a power loss
/// would leave it (only what was fsynced survives) and check that the checkpoint is then the old
/// or the new one (tests/io/crash_replay.hpp).
struct FileOperation {
  enum class Kind {
    create_file,       // an empty regular file at `path`
    write,             // `bytes` appended to the file at `path`
    fsync_file,        // the file's contents durable
    create_directory,  // an empty directory at `path`
    rename,            // `path` renamed to `target`, replacing what `target` named
    exchange,          // the names `path` and `target` swapped (renameat2 RENAME_EXCHANGE)
    remove,            // `path` removed with everything under it
    fsync_directory,   // the names in the directory at `path` durable
  };
  Kind kind;
  std::filesystem::path path;
  std::filesystem::path target = {};
  std::span<const std::byte> bytes = {};  // valid during the call only
};

namespace detail {

/// The recorder of file operations: empty, so nothing is recorded, unless a test sets it before a
/// save begins (and clears it after). Rank threads call it concurrently.
inline std::function<void(const FileOperation&)>& file_operation_recorder() {
  static std::function<void(const FileOperation&)> recorder;
  return recorder;
}
inline void record(FileOperation::Kind kind, const std::filesystem::path& path, const std::filesystem::path& target = {},
                   std::span<const std::byte> bytes = {}) {
  if (const auto& recorder = file_operation_recorder()) recorder(FileOperation{kind, path, target, bytes});
}

/// ::rename, recorded when it succeeds.
inline int rename_path(const std::filesystem::path& from, const std::filesystem::path& to) {
  const int result = ::rename(from.c_str(), to.c_str());
  if (result == 0) record(FileOperation::Kind::rename, from, to);
  return result;
}

/// std::filesystem::remove_all, recorded when it removed anything; errors go to `error`.
inline std::uintmax_t remove_path(const std::filesystem::path& path, std::error_code& error) {
  const std::uintmax_t removed = std::filesystem::remove_all(path, error);
  if (!error && removed > 0) record(FileOperation::Kind::remove, path);
  return removed;
}
inline std::uintmax_t remove_path(const std::filesystem::path& path) {
  std::error_code error;
  const std::uintmax_t removed = remove_path(path, error);
  if (error) throw_error("cannot remove '", path.string(), "': ", error.message());
  return removed;
}

}  // namespace detail

/// fsync of a directory, so that the names created, renamed or removed in it are durable.
inline void fsync_directory(const std::filesystem::path& dir) {
  detail::FdGuard g{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (g.fd < 0) detail::throw_errno("cannot open directory", dir, errno);
  if (::fsync(g.fd) != 0) detail::throw_errno("cannot fsync directory", dir, errno);
  detail::record(FileOperation::Kind::fsync_directory, dir);
}

/// fsync of a regular file by name.
inline void fsync_file(const std::filesystem::path& path) {
  detail::FdGuard g{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (g.fd < 0) detail::throw_errno("cannot open", path, errno);
  if (::fsync(g.fd) != 0) detail::throw_errno("cannot fsync", path, errno);
  detail::record(FileOperation::Kind::fsync_file, path);
}

/// Sequential writer over a file descriptor that retries short writes and reports errors
/// with the file's name.
class FileSink {
 public:
  FileSink(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  void write(std::span<const std::byte> bytes) {
    const std::byte* p = bytes.data();
    std::size_t left = bytes.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        detail::throw_errno("cannot write", path_, errno);
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    written_ += bytes.size();
    detail::record(FileOperation::Kind::write, path_, {}, bytes);
  }
  std::uint64_t written() const { return written_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  int fd_;
  std::filesystem::path path_;
  std::uint64_t written_ = 0;
};

/// Writes `path` atomically: `fill` writes the contents into a temporary file beside it
/// (".<name>.tmp-<pid>-<n>"), which is fsynced, renamed over `path`, and the directory fsynced.
/// If `fill` throws, the temporary is removed and `path` is untouched.
/// @param path  the file to create or replace; its directory must exist
/// @param fill  called once with a FileSink positioned at the start of the empty temporary
inline void write_file_atomically(const std::filesystem::path& path, const std::function<void(FileSink&)>& fill) {
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::string tmp_name = ".";  // appended, not an operator+ chain: GCC 12 warns falsely on that at -O3
  tmp_name += path.filename().string();
  tmp_name += ".tmp-";
  tmp_name += detail::unique_suffix();
  const std::filesystem::path tmp = dir / tmp_name;
  detail::FdGuard g{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
  if (g.fd < 0) detail::throw_errno("cannot create", tmp, errno);
  detail::record(FileOperation::Kind::create_file, tmp);
  try {
    FileSink sink(g.fd, tmp);
    fill(sink);
    // Data first, then the name: otherwise a crash after the rename can expose an empty file.
    if (::fsync(g.fd) != 0) detail::throw_errno("cannot fsync", tmp, errno);
    detail::record(FileOperation::Kind::fsync_file, tmp);
    const int fd = g.fd;
    g.fd = -1;
    if (::close(fd) != 0) detail::throw_errno("cannot close", tmp, errno);
    if (detail::rename_path(tmp, path) != 0) detail::throw_errno("cannot rename into place", path, errno);
  } catch (...) {
    std::error_code ignored;
    detail::remove_path(tmp, ignored);
    throw;
  }
  fsync_directory(dir);
}

}  // namespace polyshard
