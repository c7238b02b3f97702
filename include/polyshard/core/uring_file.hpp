// A file of fixed size on a local drive, read and written asynchronously through io_uring in
// aligned blocks: the storage behind NVMe offload (ZeRO-Infinity's offload_optimizer nvme).
#pragma once

#if !defined(POLYSHARD_HAVE_LIBURING)
#error "polyshard/core/uring_file.hpp needs liburing (Debian: liburing-dev); polyshard's CMake package defines POLYSHARD_HAVE_LIBURING and links it when it finds liburing"
#endif

#include <fcntl.h>
#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/core/memory_tracker.hpp"

namespace polyshard {

/// How a UringFile moves data; the engine fills it from StrategyConfig's NVMe fields, which
/// carry DeepSpeed's aio names.
struct UringFileOptions {
  /// Bytes per read or write request: a positive multiple of UringFile::alignment (block_size).
  std::int64_t block_size = 1'048'576;
  /// Requests in flight at most, each with a staging buffer of block_size bytes (queue_depth).
  int queue_depth = 8;
  /// Registers the staging buffers with the ring (io_uring fixed buffers): the kernel pins them
  /// once instead of on every request. They count against RLIMIT_MEMLOCK (pin_memory).
  bool pin_memory = false;
  /// Bypasses the page cache with O_DIRECT where the file system allows it.
  bool direct = true;
  /// The option that names the directory, quoted in errors about it.
  std::string directory_option = "nvme_path";
};

/// A file of `size()` bytes created under a directory with a name no other rank or process
/// uses, its space claimed as it is sized (at creation, and by extend()), and unlinked when the
/// object is destroyed. read() and write() queue a span at an offset and return at once; a
/// thread of the file's own cuts each span into block_size requests and keeps at most
/// queue_depth of them in flight on an io_uring, copying through staging buffers aligned to
/// 4096 bytes (so O_DIRECT works whatever the span's alignment). wait(ticket) returns when that
/// span is done, and throws polyshard::Error naming the file, the operation and the cause
/// (errno, or a short read or write).
///
/// Offsets are multiples of `alignment`. A write of n bytes writes round_up(n) bytes: the
/// bytes after the span, up to the next multiple of 4096, become zero. A span must stay valid,
/// and unmodified for a write, until its wait() returns.
class UringFile {
 public:
  /// The alignment of offsets, block sizes and staging buffers: the page size, and a multiple
  /// of every NVMe drive's logical block size, as O_DIRECT needs.
  static constexpr std::int64_t alignment = 4096;
  using Ticket = std::uint64_t;

  /// `bytes` rounded up to a multiple of `alignment`.
  static constexpr std::int64_t round_up(std::int64_t bytes) { return (bytes + alignment - 1) / alignment * alignment; }

  /// Creates `<directory>/<stem>-pid<pid>-<n>.swp` of round_up(bytes) bytes. Throws
  /// polyshard::Error when the directory is missing, not a directory or not writable (naming
  /// it and the option options.directory_option), when the drive lacks the space, when the
  /// options are invalid, or when io_uring is unavailable.
  UringFile(const std::filesystem::path& directory, std::string_view stem, std::int64_t bytes,
            UringFileOptions options = {})
      : options_(std::move(options)), size_(round_up(bytes)) {
    POLYSHARD_CHECK(options_.block_size > 0 && options_.block_size % alignment == 0,
                    "UringFile: block_size must be a positive multiple of ", alignment, " bytes, got ",
                    options_.block_size);
    POLYSHARD_CHECK(options_.queue_depth >= 1 && options_.queue_depth <= 4096,
                    "UringFile: queue_depth must be between 1 and 4096, got ", options_.queue_depth);
    POLYSHARD_CHECK(bytes >= 0, "UringFile: negative size ", bytes);
    try {
      create(directory, stem);
      start_ring();
    } catch (...) {
      close_everything();
      throw;
    }
    worker_ = std::thread([this] { run(); });
  }

  UringFile(const UringFile&) = delete;
  UringFile& operator=(const UringFile&) = delete;

  /// Finishes the requests in flight, drops those not started, and unlinks the file.
  ~UringFile() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      for (Request* r : queue_) r->issued = r->bytes;
      queue_.clear();
    }
    work_.notify_all();
    if (worker_.joinable()) worker_.join();
    close_everything();
  }

  /// Queues a write of `data` at `offset`; returns at once with the ticket to wait on.
  Ticket write(std::span<const std::byte> data, std::int64_t offset) {
    return submit(true, const_cast<std::byte*>(data.data()), static_cast<std::int64_t>(data.size()), offset);
  }
  /// Queues a read of `data.size()` bytes at `offset` into `data`.
  Ticket read(std::span<std::byte> data, std::int64_t offset) {
    return submit(false, data.data(), static_cast<std::int64_t>(data.size()), offset);
  }

  /// True once the request of `ticket` has finished, well or not (it still needs its wait()).
  bool ready(Ticket ticket) const {
    std::lock_guard lock(mutex_);
    const auto it = requests_.find(ticket);
    return it == requests_.end() || it->second.finished();
  }

  /// Blocks until the request of `ticket` is done; throws polyshard::Error if it failed.
  void wait(Ticket ticket) {
    std::unique_lock lock(mutex_);
    const auto it = requests_.find(ticket);
    POLYSHARD_CHECK(it != requests_.end(), "UringFile::wait: no request ", ticket, " on '", path_.string(),
                    "' (waited for already?)");
    done_.wait(lock, [&] { return it->second.finished(); });
    const std::string error = std::move(it->second.error);
    requests_.erase(it);
    if (!error.empty()) throw Error(error);
  }

  /// Waits for every request; throws the first failure once all are done.
  void wait_all() {
    std::vector<Ticket> tickets;
    {
      std::lock_guard lock(mutex_);
      for (const auto& entry : requests_) tickets.push_back(entry.first);
    }
    std::string first;
    for (Ticket t : tickets) {
      try {
        wait(t);
      } catch (const Error& e) {
        if (first.empty()) first = e.what();
      }
    }
    if (!first.empty()) throw Error(first);
  }

  /// Makes the file round_up(bytes) long, when it is shorter, claiming the drive's space as the
  /// constructor does (for a file laid out while its contents are made, piece by piece). Call it
  /// from the thread that submits requests.
  void extend(std::int64_t bytes) {
    const std::int64_t to = round_up(bytes);
    if (to <= size_) return;
    reserve(size_, to);
    size_ = to;
  }

  const std::filesystem::path& path() const { return path_; }
  std::int64_t size() const { return size_; }
  /// Whether O_DIRECT is in effect (false where the file system refused it, or when not asked).
  bool direct() const { return direct_; }
  const UringFileOptions& options() const { return options_; }

 private:
  struct Request {
    bool write = false;
    std::byte* data = nullptr;  // read into, or (write) only read from
    std::int64_t bytes = 0, offset = 0;
    std::int64_t issued = 0;  // bytes handed to the ring so far
    int in_flight = 0;        // blocks on the ring
    std::string error;        // the first failure
    bool finished() const { return issued == bytes && in_flight == 0; }
  };
  struct Slot {
    std::byte* buffer = nullptr;  // block_size bytes, aligned
    Request* request = nullptr;
    std::int64_t at = 0, length = 0;  // the span [at, at + length) of the request
  };
  struct Completion {
    int slot;
    int result;
  };

  static std::string os_error(int err) { return std::strerror(err); }

  void create(const std::filesystem::path& directory, std::string_view stem) {
    const std::string dir = directory.string();
    std::error_code ec;
    const auto status = std::filesystem::status(directory, ec);
    const std::string& option = options_.directory_option;
    const std::string must = "the " + option + " option must name a directory on a local drive that this process "
                             "can write to";
    POLYSHARD_CHECK(std::filesystem::exists(status), option, " '", dir, "' does not exist: ", must);
    POLYSHARD_CHECK(std::filesystem::is_directory(status), option, " '", dir, "' is not a directory: ", must);
    // Unique per process (pid), per rank and file (the stem and a counter); O_EXCL settles the rest.
    static std::atomic<std::uint64_t> counter{0};
    for (int attempt = 0;; ++attempt) {
      path_ = directory / (std::string(stem) + "-pid" + std::to_string(::getpid()) + "-" +
                           std::to_string(counter.fetch_add(1)) + ".swp");
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd_ >= 0) break;
      const int err = errno;
      if (err == EEXIST && attempt < 100) continue;
      path_.clear();
      detail::throw_error(option, " '", dir, "' is not writable: cannot create a file in it: ", os_error(err), "; ",
                          must);
    }
    // O_DIRECT is switched on after creation: open(O_CREAT | O_DIRECT) on a file system without
    // it may create the file and still fail with EINVAL. fcntl answers EINVAL in that case too.
    if (options_.direct) {
      const int flags = ::fcntl(fd_, F_GETFL);
      direct_ = flags >= 0 && ::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0;
      if (!direct_ && errno != EINVAL)
        detail::throw_error("UringFile: cannot switch on O_DIRECT for '", path_.string(), "': ", os_error(errno));
    }
    reserve(0, size_);
  }

  /// Claims bytes [from, to) of the drive for the file. Claiming the space ahead turns a full
  /// drive into an error here rather than a short write in the middle of a training step.
  void reserve(std::int64_t from, std::int64_t to) {
    if (to <= from) return;
    const std::string& option = options_.directory_option;
    const std::string dir = path_.parent_path().string();
    if (::fallocate(fd_, 0, from, to - from) != 0) {
      const int err = errno;
      POLYSHARD_CHECK(err == EOPNOTSUPP || err == ENOSYS, option, " '", dir, "': cannot reserve ", to,
                      " bytes for '", path_.string(), "': ", os_error(err));
      POLYSHARD_CHECK(::ftruncate(fd_, to) == 0, option, " '", dir, "': cannot size '", path_.string(), "' to ", to,
                      " bytes: ", os_error(errno));
    }
  }

  void start_ring() {
    const int err = io_uring_queue_init(static_cast<unsigned>(options_.queue_depth), &ring_, 0);
    POLYSHARD_CHECK(err == 0, "UringFile: io_uring_queue_init(", options_.queue_depth, ") for '", path_.string(),
                    "' failed: ", os_error(-err),
                    " (io_uring may be switched off: kernel.io_uring_disabled, or a seccomp profile)");
    ring_ready_ = true;
    const auto depth = static_cast<std::size_t>(options_.queue_depth);
    staging_bytes_ = depth * static_cast<std::size_t>(options_.block_size);
    staging_ = static_cast<std::byte*>(std::aligned_alloc(static_cast<std::size_t>(alignment), staging_bytes_));
    if (!staging_) throw std::bad_alloc();
    tracker_ = &current_memory_tracker();
    tracker_->add(MemoryCategory::Other, static_cast<std::int64_t>(staging_bytes_));
    slots_.resize(depth);
    std::vector<iovec> buffers(depth);
    for (std::size_t i = 0; i < depth; ++i) {
      slots_[i].buffer = staging_ + i * static_cast<std::size_t>(options_.block_size);
      buffers[i] = {slots_[i].buffer, static_cast<std::size_t>(options_.block_size)};
      free_slots_.push_back(static_cast<int>(depth - 1 - i));
    }
    if (options_.pin_memory) {
      const int reg = io_uring_register_buffers(&ring_, buffers.data(), static_cast<unsigned>(depth));
      POLYSHARD_CHECK(reg == 0, "pin_memory: cannot register ", staging_bytes_,
                      " bytes of staging buffers with io_uring for '", path_.string(), "': ", os_error(-reg),
                      " (pinned memory counts against RLIMIT_MEMLOCK, see `ulimit -l`; or set pin_memory = false)");
      pinned_ = true;
    }
  }

  void close_everything() {
    if (pinned_) io_uring_unregister_buffers(&ring_);
    pinned_ = false;
    if (ring_ready_) io_uring_queue_exit(&ring_);
    ring_ready_ = false;
    if (staging_) {
      std::free(staging_);
      tracker_->sub(MemoryCategory::Other, static_cast<std::int64_t>(staging_bytes_));
    }
    staging_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  Ticket submit(bool write, std::byte* data, std::int64_t bytes, std::int64_t offset) {
    const char* what = write ? "write" : "read";
    POLYSHARD_CHECK(offset >= 0 && offset % alignment == 0, "UringFile: ", what, " at offset ", offset, " of '",
                    path_.string(), "': offsets must be multiples of ", alignment);
    POLYSHARD_CHECK(offset + round_up(bytes) <= size_, "UringFile: ", what, " of ", bytes, " bytes at offset ", offset,
                    " runs past the end of '", path_.string(), "' (", size_, " bytes)");
    std::lock_guard lock(mutex_);
    POLYSHARD_CHECK(broken_.empty(), broken_);
    const Ticket ticket = next_ticket_++;
    Request& r = requests_[ticket];
    r.write = write;
    r.data = data;
    r.bytes = bytes;
    r.offset = offset;
    if (bytes > 0) {
      queue_.push_back(&r);
      work_.notify_one();
    }
    return ticket;
  }

  /// The file's thread: hands free staging buffers to the oldest requests' next blocks, submits
  /// them, and reaps completions, until the file is destroyed and nothing is in flight.
  void run() {
    std::vector<int> starting;
    std::vector<Completion> completed;
    std::unique_lock lock(mutex_);
    for (;;) {
      starting.clear();
      while (!free_slots_.empty() && !queue_.empty()) {
        Request& r = *queue_.front();
        const int s = free_slots_.back();
        free_slots_.pop_back();
        slots_[s].request = &r;
        slots_[s].at = r.issued;
        slots_[s].length = std::min(options_.block_size, r.bytes - r.issued);
        r.issued += slots_[s].length;
        ++r.in_flight;
        ++in_flight_;
        if (r.issued == r.bytes) queue_.pop_front();
        starting.push_back(s);
      }
      if (starting.empty() && in_flight_ == 0) {
        if (stopping_) return;
        work_.wait(lock);
        continue;
      }
      lock.unlock();
      // Copies and system calls run unlocked: the slots are this thread's alone, and a
      // request's span does not change while it has blocks in flight.
      for (int s : starting) prepare(s);
      std::string failure;
      if (!starting.empty()) failure = submit_prepared(static_cast<int>(starting.size()));
      completed.clear();
      if (failure.empty()) failure = reap(completed);
      lock.lock();
      if (!failure.empty()) {
        fail_everything(failure);
      } else {
        for (const Completion& c : completed) finish(c);
      }
      done_.notify_all();
    }
  }

  void prepare(int s) {
    Slot& slot = slots_[static_cast<std::size_t>(s)];
    const Request& r = *slot.request;
    const auto io_bytes = static_cast<unsigned>(round_up(slot.length));
    const auto offset = static_cast<std::uint64_t>(r.offset + slot.at);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // never null: at most queue_depth in flight
    if (r.write) {
      std::memcpy(slot.buffer, r.data + slot.at, static_cast<std::size_t>(slot.length));
      std::memset(slot.buffer + slot.length, 0, io_bytes - static_cast<std::size_t>(slot.length));
      if (pinned_) io_uring_prep_write_fixed(sqe, fd_, slot.buffer, io_bytes, offset, s);
      else io_uring_prep_write(sqe, fd_, slot.buffer, io_bytes, offset);
    } else {
      if (pinned_) io_uring_prep_read_fixed(sqe, fd_, slot.buffer, io_bytes, offset, s);
      else io_uring_prep_read(sqe, fd_, slot.buffer, io_bytes, offset);
    }
    io_uring_sqe_set_data64(sqe, static_cast<std::uint64_t>(s));
  }

  /// Submits `count` prepared entries; returns an error message when the ring refuses them.
  std::string submit_prepared(int count) {
    int done = 0;
    while (done < count) {
      const int n = io_uring_submit(&ring_);
      if (n == -EINTR || n == -EAGAIN) continue;
      if (n <= 0)
        return "UringFile: io_uring_submit on '" + path_.string() + "' failed: " + os_error(n < 0 ? -n : EIO);
      done += n;
    }
    return {};
  }

  /// Waits for at least one completion and takes every one that is there; copies read blocks
  /// out of their staging buffers.
  std::string reap(std::vector<Completion>& completed) {
    io_uring_cqe* cqe = nullptr;
    int err;
    do err = io_uring_wait_cqe(&ring_, &cqe);
    while (err == -EINTR);
    if (err < 0) return "UringFile: waiting on the io_uring of '" + path_.string() + "' failed: " + os_error(-err);
    while (cqe) {
      const auto s = static_cast<int>(io_uring_cqe_get_data64(cqe));
      const Slot& slot = slots_[static_cast<std::size_t>(s)];
      const int result = cqe->res;
      if (!slot.request->write && result == round_up(slot.length))
        std::memcpy(slot.request->data + slot.at, slot.buffer, static_cast<std::size_t>(slot.length));
      completed.push_back({s, result});
      io_uring_cqe_seen(&ring_, cqe);
      cqe = nullptr;
      if (io_uring_peek_cqe(&ring_, &cqe) != 0) cqe = nullptr;
    }
    return {};
  }

  /// Books one finished block (the lock held).
  void finish(const Completion& c) {
    Slot& slot = slots_[static_cast<std::size_t>(c.slot)];
    Request& r = *slot.request;
    const std::int64_t expected = round_up(slot.length);
    if (r.error.empty() && c.result != expected) {
      const char* what = r.write ? "write" : "read";
      const std::int64_t at = r.offset + slot.at;
      r.error = c.result < 0 ? "UringFile: " + std::string(what) + " of " + std::to_string(expected) +
                                   " bytes at offset " + std::to_string(at) + " of '" + path_.string() +
                                   "' failed: " + os_error(-c.result)
                             : "UringFile: short " + std::string(what) + " of '" + path_.string() + "': " +
                                   std::to_string(c.result) + " of " + std::to_string(expected) +
                                   " bytes at offset " + std::to_string(at);
    }
    --r.in_flight;
    --in_flight_;
    slot.request = nullptr;
    free_slots_.push_back(c.slot);
  }

  /// The ring itself failed: every request fails with `message`, and so does every later one.
  void fail_everything(const std::string& message) {
    broken_ = message;
    for (auto& [ticket, r] : requests_) {
      if (r.error.empty() && !r.finished()) r.error = message;
      r.issued = r.bytes;
      r.in_flight = 0;
    }
    queue_.clear();
    in_flight_ = 0;
    free_slots_.clear();  // a broken ring takes no more blocks
  }

  UringFileOptions options_;
  std::int64_t size_ = 0;
  std::filesystem::path path_;
  int fd_ = -1;
  bool direct_ = false;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool pinned_ = false;
  std::byte* staging_ = nullptr;  // queue_depth buffers of block_size bytes, one allocation
  std::size_t staging_bytes_ = 0;
  MemoryTracker* tracker_ = nullptr;
  std::vector<Slot> slots_;

  mutable std::mutex mutex_;
  std::condition_variable work_, done_;
  std::map<Ticket, Request> requests_;  // nodes stay put while the thread points at them
  std::deque<Request*> queue_;          // requests with blocks not yet handed to the ring
  std::vector<int> free_slots_;
  int in_flight_ = 0;
  Ticket next_ticket_ = 1;
  std::string broken_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace polyshard
