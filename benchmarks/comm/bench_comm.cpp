// Bandwidth of every collective per backend, reported as nccl-tests does (algorithm and bus
// bandwidth), beside this machine's memcpy bandwidth measured in the same run.
//
//   bench_comm [--ranks N] [--min-size 1K] [--max-size 64M] [--json FILE]
//   mpirun -np 2 bench_comm ...      adds the MPI backend (rank 0 also runs the in-process one)
//
// size is the collective's whole buffer as in nccl-tests: the all-reduce buffer, the
// reduce-scatter input, the all-gather output. algbw = size / time; busbw = algbw x 2(N-1)/N
// for all-reduce, x (N-1)/N for reduce-scatter and all-gather, x 1 for broadcast and reduce.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "polyshard/comm/thread_communicator.hpp"
#ifdef POLYSHARD_BENCH_MPI
#include "polyshard/comm/mpi_communicator.hpp"
#endif

using namespace polyshard;
using Clock = std::chrono::steady_clock;

namespace {

struct Row {
  std::string backend;
  CollectiveKind kind;
  int ranks;
  std::size_t bytes;
  double seconds;  // per call
  double memcpy_gbs;
};

double bus_factor(CollectiveKind kind, int n) {
  switch (kind) {
    case CollectiveKind::AllReduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllGather: return static_cast<double>(n - 1) / n;
    default: return 1.0;
  }
}
double algbw(const Row& r) { return static_cast<double>(r.bytes) / r.seconds / 1e9; }
double busbw(const Row& r) { return algbw(r) * bus_factor(r.kind, r.ranks); }

std::size_t parse_size(const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  switch (end && *end ? *end : ' ') {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<std::size_t>(v);
}

std::string size_text(std::size_t b) {
  char buf[32];
  if (b >= (1u << 20)) std::snprintf(buf, sizeof buf, "%zuM", b >> 20);
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%zuK", b >> 10);
  else std::snprintf(buf, sizeof buf, "%zu", b);
  return buf;
}

/// Calls per measurement so that one lasts about `target`, from the time of one call.
int iterations_for(double one_call, double target = 0.04) {
  return static_cast<int>(std::clamp(target / std::max(one_call, 1e-7), 1.0, 20000.0));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// memcpy bandwidth (bytes copied per second) for one buffer of `bytes`, single thread.
double memcpy_gbs(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::memcpy(b.data(), a.data(), bytes);
  auto t0 = Clock::now();
  std::memcpy(b.data(), a.data(), bytes);
  const int iters = iterations_for(std::chrono::duration<double>(Clock::now() - t0).count());
  std::vector<double> times;
  for (int rep = 0; rep < 5; ++rep) {
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");  // keep every copy
    }
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  return static_cast<double>(bytes) / median(times) / 1e9;
}

/// Times `kind` on `comm` (every rank calls this with the same arguments); returns the median
/// seconds per call, from rank 0's clock between barriers.
template <class Comm>
double time_collective(Comm& comm, CollectiveKind kind, std::size_t bytes) {
  const int N = comm.size();
  const std::size_t per_rank = std::max<std::size_t>(1, bytes / sizeof(float) / static_cast<std::size_t>(N));
  const std::size_t whole = per_rank * static_cast<std::size_t>(N);
  std::vector<float> big(whole, 1.0f), small(per_rank, 1.0f);
  auto call = [&] {
    switch (kind) {
      case CollectiveKind::AllReduce: comm.all_reduce(std::span<float>(big)); break;
      case CollectiveKind::ReduceScatter: comm.reduce_scatter(std::span<const float>(big), std::span<float>(small)); break;
      case CollectiveKind::AllGather: comm.all_gather(std::span<const float>(small), std::span<float>(big)); break;
      case CollectiveKind::Broadcast: comm.broadcast(std::span<float>(big), 0); break;
      case CollectiveKind::Reduce: comm.reduce(std::span<float>(big), 0); break;
      default: break;
    }
  };
  call();  // warm-up: page faults, scratch buffers
  comm.barrier();
  auto t0 = Clock::now();
  call();
  comm.barrier();
  std::vector<double> probe{std::chrono::duration<double>(Clock::now() - t0).count()};
  comm.broadcast(std::span<double>(probe), 0);  // every rank runs the same number of calls
  const int iters = iterations_for(probe[0]);
  std::vector<double> times;
  for (int rep = 0; rep < 3; ++rep) {
    comm.barrier();
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) call();
    comm.barrier();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  return median(times);
}

const CollectiveKind kinds[] = {CollectiveKind::AllReduce, CollectiveKind::ReduceScatter, CollectiveKind::AllGather,
                                CollectiveKind::Broadcast, CollectiveKind::Reduce};

std::size_t actual_bytes(std::size_t bytes, int n) {
  return std::max<std::size_t>(1, bytes / sizeof(float) / static_cast<std::size_t>(n)) * static_cast<std::size_t>(n) *
         sizeof(float);
}

template <class Comm>
void run_backend(Comm& comm, const char* backend, const std::vector<std::size_t>& sizes, std::vector<Row>& rows,
                 const std::vector<double>& memcpy_of) {
  for (CollectiveKind kind : kinds) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const double t = time_collective(comm, kind, sizes[i]);
      if (comm.rank() == 0) {
        rows.push_back(Row{backend, kind, comm.size(), actual_bytes(sizes[i], comm.size()), t, memcpy_of[i]});
        const Row& r = rows.back();
        std::printf("%-10s %-15s %6d %8s %12.1f %12.2f %12.2f %12.2f %10.2f\n", backend,
                    std::string(collective_name(kind)).c_str(), r.ranks, size_text(r.bytes).c_str(), t * 1e6, algbw(r),
                    busbw(r), r.memcpy_gbs, busbw(r) / r.memcpy_gbs);
        std::fflush(stdout);
      }
    }
  }
}

void write_json(const std::string& path, const std::vector<Row>& rows, int ranks) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "{\n  \"benchmark\": \"comm\",\n  \"dtype\": \"F32\",\n  \"ranks\": %d,\n  \"results\": [\n", ranks);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "    {\"backend\": \"%s\", \"collective\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"time_us\": %.3f, "
                 "\"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f, \"memcpy_gbs\": %.4f}%s\n",
                 r.backend.c_str(), std::string(collective_name(r.kind)).c_str(), r.ranks, r.bytes, r.seconds * 1e6,
                 algbw(r), busbw(r), r.memcpy_gbs, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
}

/// Rank-0 summary against the targets: from 1 MiB, in-process busbw >= memcpy / 2, and MPI
/// busbw >= in-process busbw / 2.
void summarize(const std::vector<Row>& rows) {
  double worst_thread = 1e9, worst_mpi = 1e9;
  std::string where_thread, where_mpi;
  for (const Row& r : rows) {
    if (r.bytes < (1u << 20)) continue;
    if (r.backend == "thread" && busbw(r) / r.memcpy_gbs < worst_thread) {
      worst_thread = busbw(r) / r.memcpy_gbs;
      where_thread = std::string(collective_name(r.kind)) + " " + size_text(r.bytes);
    }
    if (r.backend == "mpi") {
      for (const Row& t : rows)
        if (t.backend == "thread" && t.kind == r.kind && t.bytes == r.bytes && busbw(r) / busbw(t) < worst_mpi) {
          worst_mpi = busbw(r) / busbw(t);
          where_mpi = std::string(collective_name(r.kind)) + " " + size_text(r.bytes);
        }
    }
  }
  if (!where_thread.empty())
    std::printf("# from 1M: lowest in-process busbw / memcpy = %.2f (%s); target >= 0.5: %s\n", worst_thread,
                where_thread.c_str(), worst_thread >= 0.5 ? "met" : "MISSED");
  if (!where_mpi.empty())
    std::printf("# from 1M: lowest MPI busbw / in-process busbw = %.2f (%s); target >= 0.5: %s\n", worst_mpi,
                where_mpi.c_str(), worst_mpi >= 0.5 ? "met" : "MISSED");
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t min_size = 1024, max_size = 64u << 20;
  int ranks = 0;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--max-size") max_size = parse_size(next());
    else if (a == "--min-size") min_size = parse_size(next());
    else if (a == "--ranks") ranks = std::atoi(next());
    else if (a == "--json") json = next();
    else {
      std::printf("usage: %s [--ranks N] [--min-size 1K] [--max-size 64M] [--json FILE]\n"
                  "       under mpirun (-np >= 2) the MPI backend is measured too\n", argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  std::vector<std::size_t> sizes;
  for (std::size_t s = min_size; s <= max_size; s *= 4) sizes.push_back(s);

  int world_rank = 0, world_size = 1;
#ifdef POLYSHARD_BENCH_MPI
  // Only when a launcher started us: a plain run stays a plain process.
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  std::optional<MpiSession> session;
  std::optional<MpiCommunicator> mpi;
  if (launched) {
    session.emplace(&argc, &argv);
    mpi.emplace(MpiCommunicator::world());
    world_rank = mpi->rank();
    world_size = mpi->size();
  }
  // The other processes sleep (not spin) while rank 0 measures alone.
  auto quiet_barrier = [&] {
    if (!mpi || world_size == 1) return;
    MPI_Request r;
    MPI_Ibarrier(mpi->native(), &r);
    for (int done = 0; !done;) {
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
#else
  auto quiet_barrier = [] {};
#endif
  if (ranks <= 0) ranks = world_size > 1 ? world_size : 2;

  std::vector<Row> rows;
  std::vector<double> memcpy_of(sizes.size());
  if (world_rank == 0) {
    std::printf("# polyshard communication benchmark: F32, in-process ranks %d, MPI processes %d, %u hardware threads\n",
                ranks, world_size, std::thread::hardware_concurrency());
    std::printf("# memcpy (single thread, same run) is the ceiling of the in-process backend\n");
    for (std::size_t i = 0; i < sizes.size(); ++i) memcpy_of[i] = memcpy_gbs(actual_bytes(sizes[i], ranks));
    std::printf("%-10s %-15s %6s %8s %12s %12s %12s %12s %10s\n", "backend", "collective", "ranks", "size", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "memcpy(GB/s)", "bus/memcpy");
    run_ranks(ranks, [&](ThreadCommunicator& comm) { run_backend(comm, "thread", sizes, rows, memcpy_of); });
  }
  quiet_barrier();
#ifdef POLYSHARD_BENCH_MPI
  if (mpi && world_size > 1) {
    // memcpy of the MPI run's sizes (they round to this world size).
    std::vector<double> mpi_memcpy = memcpy_of;
    if (world_rank == 0 && world_size != ranks)
      for (std::size_t i = 0; i < sizes.size(); ++i) mpi_memcpy[i] = memcpy_gbs(actual_bytes(sizes[i], world_size));
    quiet_barrier();
    run_backend(*mpi, "mpi", sizes, rows, mpi_memcpy);
  }
#endif
  if (world_rank == 0) {
    summarize(rows);
    if (!json.empty()) write_json(json, rows, ranks);
  }
  return 0;
}
