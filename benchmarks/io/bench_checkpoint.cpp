// Saving and loading a sharded checkpoint of GPT-2 small with its AdamW state (about 1.5 GB)
// against the disk's sequential write and read bandwidth, measured in the same run on the same
// directory: plain write() + fsync of a file as large as the checkpoint, and read() of it after
// its pages were dropped from the cache. The checkpoint's reads start from a dropped cache too.
// Each figure is the median of five rounds (one with --quick), the disk probed in each round just
// before the checkpoint, and the percentages are medians of the per-round ratios.
//
//   bench_checkpoint [--quick] [--json FILE] [--dir DIR]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/io/sharded_checkpoint.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "polyshard/policy/policy.hpp"
#include "support/report.hpp"

using namespace polyshard;
namespace fs = std::filesystem;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// Asks the kernel to forget the cached pages of every file under `path` (they are clean after
/// the fsync of a save), so that the next read comes from the disk.
void drop_cache(const fs::path& path) {
  auto drop = [](const fs::path& f) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  if (fs::is_directory(path))
    for (const auto& e : fs::recursive_directory_iterator(path)) {
      if (e.is_regular_file()) drop(e.path());
    }
  else drop(path);
}

std::uint64_t bytes_under(const fs::path& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

/// Sequential write (8 MiB writes, then fsync) and read of `bytes` bytes: GB/s each.
std::pair<double, double> disk_bandwidth(const fs::path& file, std::uint64_t bytes) {
  constexpr std::size_t chunk = 8 << 20;
  std::vector<char> buffer(chunk);
  for (std::size_t i = 0; i < chunk; ++i) buffer[i] = static_cast<char>(i * 131 + 7);  // not all zero
  const int out = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  POLYSHARD_CHECK(out >= 0, "bench_checkpoint: cannot create ", file.string());
  double t = now();
  for (std::uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::write(out, buffer.data(), std::min<std::uint64_t>(chunk, bytes - done));
    POLYSHARD_CHECK(n > 0, "bench_checkpoint: write failed");
    done += static_cast<std::uint64_t>(n);
  }
  ::fsync(out);
  ::close(out);
  const double write_s = now() - t;
  drop_cache(file);
  const int in = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  t = now();
  for (std::uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::read(in, buffer.data(), chunk);
    POLYSHARD_CHECK(n > 0, "bench_checkpoint: read failed");
    done += static_cast<std::uint64_t>(n);
  }
  const double read_s = now() - t;
  ::close(in);
  fs::remove(file);
  return {double(bytes) / write_s / 1e9, double(bytes) / read_s / 1e9};
}

struct Timing {
  double save_gbs = 0, load_gbs = 0, disk_write_gbs = 0, disk_read_gbs = 0, save_ratio = 0, load_ratio = 0;
  std::uint64_t bytes = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// `repeats` rounds, each probing the disk with a file of the checkpoint's size and then saving
/// and loading the checkpoint (the load from a dropped cache), so that both see the same disk
/// weather; medians of each figure and of the per-round ratios.
template <class S>
Timing save_and_load(const GptConfig& cfg, int world, const fs::path& dir, int repeats) {
  Timing timing;
  std::vector<double> saves, loads, writes, reads, save_ratios, load_ratios;
  run_ranks(world, [&](ThreadCommunicator& comm) {
    Gpt<float> model(cfg);
    Engine<S, Gpt<float>, ThreadCommunicator, AdamW<float>> engine(model, comm, AdamWConfig{}, {}, 1);
    save_checkpoint(engine, dir, {.step = 1});  // once untimed, for the probe's size
    if (comm.rank() == 0) timing.bytes = bytes_under(dir);
    for (int round = 0; round < repeats; ++round) {
      if (comm.rank() == 0) {
        const auto [w, r] = disk_bandwidth(dir.parent_path() / "disk-probe", timing.bytes);
        writes.push_back(w);
        reads.push_back(r);
      }
      comm.barrier();
      const double t0 = now();
      save_checkpoint(engine, dir, {.step = 1});
      const double t1 = now();
      if (comm.rank() == 0) drop_cache(dir);
      comm.barrier();
      const double t2 = now();
      load_checkpoint(engine, dir);
      comm.barrier();
      if (comm.rank() == 0) {
        saves.push_back(double(timing.bytes) / (t1 - t0) / 1e9);
        loads.push_back(double(timing.bytes) / (now() - t2) / 1e9);
        save_ratios.push_back(saves.back() / writes.back());
        load_ratios.push_back(loads.back() / reads.back());
      }
    }
  });
  timing.save_gbs = median(saves);
  timing.load_gbs = median(loads);
  timing.disk_write_gbs = median(writes);
  timing.disk_read_gbs = median(reads);
  timing.save_ratio = median(save_ratios);
  timing.load_ratio = median(load_ratios);
  return timing;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args = bench::parse_args(
      argc, argv, "bench_checkpoint.json", {{"--dir", "DIR", "where checkpoints go (default: the temp directory)"}});
  const fs::path parent = args.has("--dir") ? fs::path(args.given.at("--dir")) : fs::temp_directory_path();
  const fs::path dir = parent / ("polyshard-bench-checkpoint-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  GptConfig cfg;  // GPT-2 small: 124M parameters, 1.5 GB with AdamW's two moments
  if (args.quick) cfg = {.vocab_size = 4096, .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 256};

  bench::Table table("Sharded checkpoint of GPT-2" + std::string(args.quick ? " (quick: 4 layers, 256 wide)" : " small") +
                     " with AdamW state, against the disk's sequential bandwidth");
  const int repeats = args.quick ? 1 : 5;
  auto report = [&](const std::string& name, int world, const Timing& t) {
    table.row()
        .set("strategy", name)
        .set("ranks", world, 0)
        .set("GB", double(t.bytes) / 1e9, 2)
        .set("save GB/s", t.save_gbs, 2)
        .set("disk write GB/s", t.disk_write_gbs, 2)
        .set("save % of disk", 100 * t.save_ratio)
        .set("load GB/s", t.load_gbs, 2)
        .set("disk read GB/s", t.disk_read_gbs, 2)
        .set("load % of disk", 100 * t.load_ratio);
  };
  report("ddp", 1, save_and_load<DDP>(cfg, 1, dir / "ddp", repeats));
  fs::remove_all(dir / "ddp");
  report("zero3", 4, save_and_load<ZeRO<3>>(cfg, 4, dir / "zero3", repeats));
  fs::remove_all(dir);
  table.print();
  table.write_json(args.json);
  return 0;
}
