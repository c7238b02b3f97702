// UringFile: what is written comes back, lands where it was asked to in the file, across
// block boundaries and with fewer requests in flight than blocks; failures name the file.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <thread>

#include "io/temp_dir.hpp"
#include "polyshard/core/uring_file.hpp"

using namespace polyshard;

namespace {

std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(gen() & 0xff);
  return out;
}

/// The file's bytes [offset, offset + n) as the file system has them.
std::vector<std::byte> file_bytes(const std::filesystem::path& path, std::int64_t offset, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(offset);
  std::vector<std::byte> out(n);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n));
  REQUIRE(in.gcount() == static_cast<std::streamsize>(n));
  return out;
}

std::vector<std::filesystem::path> files_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) out.push_back(entry.path());
  return out;
}

}  // namespace

TEST_CASE("UringFile: random data round-trips across block boundaries with a shallow queue", "[core][uring]") {
  const bool direct = GENERATE(true, false);
  const bool pin = GENERATE(false, true);
  const int depth = GENERATE(1, 2, 3);
  CAPTURE(direct, pin, depth);
  TempDir dir;
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  constexpr std::int64_t block = 4096;
  // 5 blocks and a part: more blocks than requests in flight, and a partial last block.
  const std::size_t n = 5 * block + 123;
  const std::int64_t a = 2 * block, b = a + UringFile::round_up(static_cast<std::int64_t>(n));
  {
    UringFile file(dir.path(), "test", b + static_cast<std::int64_t>(n),
                   {.block_size = block, .queue_depth = depth, .pin_memory = pin, .direct = direct});
    if (!direct) CHECK_FALSE(file.direct());
    CHECK(file.size() == UringFile::round_up(b + static_cast<std::int64_t>(n)));
    CHECK(tracker.current(MemoryCategory::Other) == depth * block);  // the staging buffers

    const auto first = random_bytes(n, 1), second = random_bytes(n, 2);
    // Spans at odd addresses: the staging buffers, not the caller's memory, meet O_DIRECT's alignment.
    std::vector<std::byte> source(n + 1);
    std::copy(second.begin(), second.end(), source.begin() + 1);
    const auto t1 = file.write(first, a);
    const auto t2 = file.write(std::span<const std::byte>(source).subspan(1), b);
    file.wait(t2);
    file.wait(t1);

    // The bytes are where they were asked to go, and the padding of the last block is zero.
    CHECK(file_bytes(file.path(), a, n) == first);
    CHECK(file_bytes(file.path(), b, n) == second);
    const auto tail = file_bytes(file.path(), a + static_cast<std::int64_t>(n), UringFile::round_up(n) - n);
    CHECK(std::all_of(tail.begin(), tail.end(), [](std::byte x) { return x == std::byte{0}; }));

    std::vector<std::byte> back_first(n), back_second(n + 3);
    const auto r2 = file.read(std::span<std::byte>(back_second).subspan(3), b);
    const auto r1 = file.read(back_first, a);
    while (!file.ready(r1)) std::this_thread::yield();  // ready() turns true without a wait()
    file.wait_all();
    CHECK(back_first == first);
    CHECK(std::equal(second.begin(), second.end(), back_second.begin() + 3));
    CHECK_THROWS_WITH(file.wait(r2), Catch::Contains("waited for already"));

    // Never written: the preallocated space reads as zeros.
    std::vector<std::byte> head(static_cast<std::size_t>(a), std::byte{1});
    file.wait(file.read(head, 0));
    CHECK(std::all_of(head.begin(), head.end(), [](std::byte x) { return x == std::byte{0}; }));
  }
  CHECK(tracker.current(MemoryCategory::Other) == 0);
}

TEST_CASE("UringFile: many requests in flight complete, whatever order they are waited in", "[core][uring]") {
  TempDir dir;
  constexpr std::int64_t block = 4096;
  constexpr int regions = 12;
  const std::size_t n = 3 * block - 7;
  const std::int64_t stride = UringFile::round_up(static_cast<std::int64_t>(n));
  UringFile file(dir.path(), "many", regions * stride, {.block_size = block, .queue_depth = 2});
  std::vector<std::vector<std::byte>> data;
  std::vector<UringFile::Ticket> tickets;
  for (int i = 0; i < regions; ++i) {
    data.push_back(random_bytes(n, 100 + i));
    tickets.push_back(file.write(data.back(), i * stride));
  }
  for (int i = regions - 1; i >= 0; --i) file.wait(tickets[static_cast<std::size_t>(i)]);
  std::vector<std::vector<std::byte>> back(regions, std::vector<std::byte>(n));
  tickets.clear();
  for (int i = 0; i < regions; ++i) tickets.push_back(file.read(back[static_cast<std::size_t>(i)], i * stride));
  for (int i : {5, 0, 11, 3, 1, 2, 4, 6, 7, 8, 9, 10}) file.wait(tickets[static_cast<std::size_t>(i)]);
  CHECK(back == data);
  CHECK_THROWS_WITH(file.wait(tickets[0]), Catch::Contains("waited for already"));
}

TEST_CASE("UringFile: a file per object under the directory, gone with the object", "[core][uring]") {
  TempDir dir;
  {
    UringFile one(dir.path(), "rank0", 10'000), two(dir.path(), "rank0", 10'000);
    CHECK(one.path() != two.path());
    CHECK(one.path().parent_path() == dir.path());
    CHECK(one.path().filename().string().rfind("rank0-pid" + std::to_string(::getpid()), 0) == 0);
    CHECK(std::filesystem::file_size(one.path()) == 12'288);  // preallocated, rounded up to 4096
    CHECK(files_in(dir.path()).size() == 2);
  }
  CHECK(files_in(dir.path()).empty());
}

TEST_CASE("UringFile: extend() grows an empty file piece by piece, what was written staying", "[core][uring]") {
  TempDir dir;
  UringFile file(dir.path(), "grown", 0, {.block_size = 4096});
  CHECK(file.size() == 0);
  CHECK(std::filesystem::file_size(file.path()) == 0);
  const std::vector<std::byte> first = random_bytes(5000, 1), second = random_bytes(300, 2);
  CHECK_THROWS_WITH(file.write(first, 0), Catch::Contains("runs past the end"));  // not yet long enough
  file.extend(5000);
  CHECK(file.size() == 8192);  // rounded up to 4096
  CHECK(std::filesystem::file_size(file.path()) == 8192);
  file.wait(file.write(first, 0));
  file.extend(100);  // shorter than the file: nothing changes
  CHECK(file.size() == 8192);
  file.extend(8192 + 300);
  CHECK(file.size() == 12'288);
  file.wait(file.write(second, 8192));
  CHECK(file_bytes(file.path(), 0, first.size()) == first);
  CHECK(file_bytes(file.path(), 8192, second.size()) == second);
  std::vector<std::byte> back(first.size());
  file.wait(file.read(back, 0));
  CHECK(back == first);
}

TEST_CASE("UringFile: an unusable nvme_path is a clear error naming it and the option", "[core][uring]") {
  TempDir dir;
  SECTION("missing") {
    const auto missing = dir / "no-such-dir";
    CHECK_THROWS_WITH(UringFile(missing, "x", 4096),
                      Catch::Contains("nvme_path '" + missing.string() + "' does not exist") &&
                          Catch::Contains("the nvme_path option must name a directory"));
  }
  SECTION("a file, not a directory") {
    const auto file = dir / "plain";
    std::ofstream(file) << "x";
    CHECK_THROWS_WITH(UringFile(file, "x", 4096), Catch::Contains("nvme_path '" + file.string() + "' is not a directory"));
  }
  SECTION("not writable") {
    // Root writes into a read-only directory anyway; sysfs refuses new files even to root.
    std::filesystem::path locked = dir / "locked";
    if (::geteuid() == 0) {
      locked = "/sys";
    } else {
      std::filesystem::create_directory(locked);
      std::filesystem::permissions(locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    }
    CHECK_THROWS_WITH(UringFile(locked, "x", 4096), Catch::Contains("nvme_path '" + locked.string() + "' is not writable") &&
                                                        Catch::Contains("the nvme_path option"));
    if (::geteuid() != 0) std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  }
}

TEST_CASE("UringFile: invalid options and out-of-range requests are refused", "[core][uring]") {
  TempDir dir;
  CHECK_THROWS_WITH(UringFile(dir.path(), "x", 4096, {.block_size = 1000}), Catch::Contains("block_size must be a positive multiple of 4096"));
  CHECK_THROWS_WITH(UringFile(dir.path(), "x", 4096, {.queue_depth = 0}), Catch::Contains("queue_depth must be between 1"));
  CHECK(files_in(dir.path()).empty());  // nothing left behind by the refusals
  UringFile file(dir.path(), "x", 8192, {.block_size = 4096});
  std::vector<std::byte> data(100);
  CHECK_THROWS_WITH(file.write(data, 100), Catch::Contains("offsets must be multiples of 4096"));
  CHECK_THROWS_WITH(file.write(std::vector<std::byte>(8193), 0), Catch::Contains("runs past the end of '" + file.path().string()));
  CHECK_THROWS_WITH(file.read(data, 8192), Catch::Contains("runs past the end"));
}

TEST_CASE("UringFile: a short read is an error naming the file and the operation", "[core][uring]") {
  TempDir dir;
  UringFile file(dir.path(), "short", 3 * 4096, {.block_size = 4096, .queue_depth = 2, .direct = false});
  std::vector<std::byte> data(3 * 4096, std::byte{7});
  file.wait(file.write(data, 0));
  // Something else shrinks the file under it.
  REQUIRE(::truncate(file.path().c_str(), 4096 + 100) == 0);
  data.resize(2 * 4096);
  CHECK_THROWS_WITH(file.wait(file.read(data, 0)), Catch::Contains("short read of '" + file.path().string() + "'") &&
                                                       Catch::Contains("100 of 4096 bytes at offset 4096"));
  // The file still works for what is there.
  std::vector<std::byte> first(4096);
  file.wait(file.read(first, 0));
  CHECK(first == std::vector<std::byte>(4096, std::byte{7}));
}
