// CheckpointIO: where and how the files of a sharded checkpoint are stored, the object Lightning's
// strategies take as checkpoint_io. save_checkpoint and load_checkpoint go through one; the
// default, AtomicDirectoryIO, keeps a checkpoint as a directory on a file system every rank sees
// that appears only when complete. Another store (object storage, a copy kept on a second file
// system, a local cache of a remote one) is a class of one's own.
#pragma once

#include <filesystem>
#include <string>

#include "polyshard/core/error.hpp"
#include "polyshard/io/atomic_directory.hpp"
#include "polyshard/io/atomic_file.hpp"
#include "polyshard/io/checkpoint_metadata.hpp"

namespace polyshard {

/// The storage of sharded checkpoints. A save is a transaction: rank 0 begins it and gets a
/// directory every rank writes its files into; once every file is written rank 0 commits it, or
/// aborts it if a rank failed. A load asks each rank's object for a directory holding the files.
/// Called from the ranks' threads: an object several ranks share must allow that (each method is
/// called by one rank at a time for a given save, but rank threads of several engines may call
/// it at once).
class CheckpointIO {
 public:
  virtual ~CheckpointIO() = default;
  /// Rank 0, before any rank writes: a new, empty directory, visible to every rank, into which
  /// the files of checkpoint `dir` are written.
  virtual std::filesystem::path begin_save(const std::filesystem::path& dir) = 0;
  /// Rank 0, once every rank's files and the metadata are in `staging`: makes them checkpoint
  /// `dir`, replacing any earlier one. On failure it throws, and `dir` is as it was.
  virtual void commit_save(const std::filesystem::path& staging, const std::filesystem::path& dir) = 0;
  /// Rank 0, when a rank failed to write: gives the save up; `dir` is as it was.
  virtual void abort_save(const std::filesystem::path& staging) = 0;
  /// Every rank, before loading: a directory holding the files of checkpoint `dir`.
  virtual std::filesystem::path open_for_load(const std::filesystem::path& dir) = 0;
  /// Removes checkpoint `dir` (Lightning's remove_checkpoint); refuses what is not one.
  virtual void remove_checkpoint(const std::filesystem::path& dir) = 0;
};

/// The default CheckpointIO: `dir` itself, written through a temporary directory beside it that
/// one rename swaps into place (atomic_directory.hpp), so that a process killed mid-save leaves
/// the previous checkpoint whole.
class AtomicDirectoryIO final : public CheckpointIO {
 public:
  std::filesystem::path begin_save(const std::filesystem::path& dir) override { return begin_directory_write(dir); }
  void commit_save(const std::filesystem::path& staging, const std::filesystem::path& dir) override {
    commit_directory_write(staging, dir);
  }
  void abort_save(const std::filesystem::path& staging) override { abort_directory_write(staging); }
  std::filesystem::path open_for_load(const std::filesystem::path& dir) override { return dir; }
  void remove_checkpoint(const std::filesystem::path& dir) override {
    // A checkpoint has its metadata: anything else is not this function's to delete.
    POLYSHARD_CHECK(std::filesystem::is_regular_file(dir / checkpoint_metadata_file), "remove_checkpoint: '",
                    dir.string(), "' is not a checkpoint (no ", checkpoint_metadata_file, "); nothing was removed");
    std::error_code ec;
    detail::remove_path(dir, ec);  // recorded, as every operation of the file layer
    POLYSHARD_CHECK(!ec, "remove_checkpoint: cannot remove '", dir.string(), "': ", ec.message());
    fsync_directory(detail::parent_of(dir));
  }
};

/// The CheckpointIO save_checkpoint and load_checkpoint use unless given one.
inline CheckpointIO& default_checkpoint_io() {
  static AtomicDirectoryIO io;
  return io;
}

/// Removes checkpoint `dir` from `io`'s store (Lightning's CheckpointIO.remove_checkpoint), as a
/// training loop that keeps the last few does; refuses a directory that is not a checkpoint.
inline void remove_checkpoint(const std::filesystem::path& dir, CheckpointIO& io = default_checkpoint_io()) {
  io.remove_checkpoint(dir);
}

}  // namespace polyshard
