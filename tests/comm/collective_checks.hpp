// Collective checks written once for every backend: each rank runs them and they throw on the
// first wrong value (Catch2 assertions are not thread-safe, so rank threads must not use them).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "polyshard/comm/communicator.hpp"
#include "polyshard/core/dtype.hpp"

namespace polyshard::test_comm {

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream out;
  out.precision(9);  // enough digits to tell two floats apart
  (out << ... << parts);
  throw std::runtime_error(out.str());
}

/// Buffer sizes every collective is run with: empty, one, small primes, sizes that no world
/// size of 2 to 5 divides, and a few thousand (several cache lines per chunk).
inline const std::vector<std::size_t> buffer_sizes{0, 1, 2, 3, 7, 13, 31, 97, 1021, 4099};

/// The value rank `rank` holds at index `i` in test number `salt`: in [-1, 1) with a full
/// mantissa, so that adding in another order gives other bits and a wrong order is caught.
inline double input_value(int rank, std::uint64_t i, int salt) {
  std::uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(rank) + 7) * 0xC2B2AE3D27D4EB4Full ^
                    (static_cast<std::uint64_t>(salt) + 3) * 0x165667B19E3779F9ull;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return static_cast<double>(h % 2000003) / 1000001.5 - 1.0;
}

template <FloatElement T>
std::vector<T> make_input(int rank, std::size_t n, int salt) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(static_cast<compute_t<T>>(input_value(rank, i, salt)));
  return x;
}

template <FloatElement T>
std::vector<std::vector<T>> all_inputs(int world, std::size_t n, int salt) {
  std::vector<std::vector<T>> xs;
  for (int q = 0; q < world; ++q) xs.push_back(make_input<T>(q, n, salt));
  return xs;
}

/// The serial reference of the documented order: element i of the result is x[0][i] + x[1][i]
/// + ... + x[N-1][i], added left to right in the compute type, then divided by N for Avg,
/// wherever i lies in the buffer. reduce adds in the same order.
template <FloatElement T>
T rank_order_sum(const std::vector<std::vector<T>>& xs, std::size_t i, ReduceOp op) {
  using C = compute_t<T>;
  C sum = static_cast<C>(xs[0][i]);
  for (std::size_t q = 1; q < xs.size(); ++q) sum = static_cast<C>(sum + static_cast<C>(xs[q][i]));
  if (op == ReduceOp::Avg) sum = static_cast<C>(sum / static_cast<C>(xs.size()));
  return static_cast<T>(sum);
}

/// The exact sum in double, and how far a T result may be from it: the final rounding to T of
/// a value up to N in magnitude, plus the float accumulation of N terms.
template <FloatElement T>
double exact_sum(const std::vector<std::vector<T>>& xs, std::size_t i, ReduceOp op) {
  double sum = 0;
  for (const auto& x : xs) sum += static_cast<double>(static_cast<compute_t<T>>(x[i]));
  return op == ReduceOp::Avg ? sum / static_cast<double>(xs.size()) : sum;
}
template <FloatElement T>
double tolerance(int world) {
  double eps = 1e-14;
  if constexpr (std::is_same_v<T, float>) eps = 2e-7;
  if constexpr (std::is_same_v<T, half>) eps = 1e-3;
  if constexpr (std::is_same_v<T, bfloat16>) eps = 8e-3;
  return 2.0 * world * (eps + 2e-7);
}

template <FloatElement T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <FloatElement T>
void expect_bits(const char* what, std::size_t n, int rank, std::size_t i, T got, T want, double exact, int world) {
  if (!same_bits(got, want))
    fail(what, "<", dtype_name_v<T>, ">: n=", n, " rank ", rank, " index ", i, ": got ",
         static_cast<double>(static_cast<compute_t<T>>(got)), ", the rank-order reference is ",
         static_cast<double>(static_cast<compute_t<T>>(want)));
  if (std::abs(static_cast<double>(static_cast<compute_t<T>>(got)) - exact) > tolerance<T>(world))
    fail(what, "<", dtype_name_v<T>, ">: n=", n, " rank ", rank, " index ", i, ": got ",
         static_cast<double>(static_cast<compute_t<T>>(got)), ", the exact sum is ", exact);
}

/// The byte counter after one call, against the formula written out here (not taken from the
/// library): 2(N-1)/N of the buffer for all-reduce, (N-1)/N for reduce-scatter and all-gather,
/// one buffer for broadcast and reduce.
template <class Comm>
void expect_bytes(Comm& comm, CollectiveKind kind, double buffer_bytes) {
  const double N = comm.size();
  double want = 0;
  if (comm.size() > 1) {
    switch (kind) {
      case CollectiveKind::AllReduce: want = 2 * (N - 1) / N * buffer_bytes; break;
      case CollectiveKind::ReduceScatter:
      case CollectiveKind::AllGather: want = (N - 1) / N * buffer_bytes; break;
      default: want = buffer_bytes;
    }
  }
  const double got = comm.stats().bytes_sent(kind);
  if (std::abs(got - want) > 1e-9 * (1 + want) || comm.stats().calls(kind) != 1)
    fail("byte counter of ", collective_name(kind), " with N=", comm.size(), " and a buffer of ", buffer_bytes,
         " bytes: got ", got, " bytes in ", comm.stats().calls(kind), " calls, want ", want, " in 1 call");
  comm.stats().reset();
  if (comm.stats().bytes_sent(kind) != 0 || comm.stats().calls(kind) != 0) fail("stats().reset() left counts");
}

/// Runs every collective with element type T over every size of buffer_sizes, both operators and
/// a root that moves with the size, and checks results bit for bit against the serial reference
/// of the documented order, within tolerance of the exact sum, and the byte counters.
template <class Comm, FloatElement T>
void check_collectives(Comm& comm, int salt) {
  const int N = comm.size();
  const int r = comm.rank();
  comm.stats().reset();
  for (std::size_t n : buffer_sizes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      const int s = salt + static_cast<int>(n) * 3 + (op == ReduceOp::Avg);
      // all_reduce: n elements, chunks uneven when N does not divide n.
      {
        const auto xs = all_inputs<T>(N, n, s);
        std::vector<T> buf = xs[static_cast<std::size_t>(r)];
        comm.all_reduce(std::span<T>(buf), op);
        for (std::size_t i = 0; i < n; ++i)
          expect_bits("all_reduce", n, r, i, buf[i], rank_order_sum(xs, i, op), exact_sum(xs, i, op), N);
        expect_bytes(comm, CollectiveKind::AllReduce, static_cast<double>(n * sizeof(T)));
      }
      // reduce_scatter: N x n in, n out.
      {
        const auto xs = all_inputs<T>(N, n * static_cast<std::size_t>(N), s + 1);
        std::vector<T> out(n, static_cast<T>(7.0f));
        comm.reduce_scatter(std::span<const T>(xs[static_cast<std::size_t>(r)]), std::span<T>(out), op);
        for (std::size_t i = 0; i < n; ++i) {
          const std::size_t g = n * static_cast<std::size_t>(r) + i;
          expect_bits("reduce_scatter", n, r, i, out[i], rank_order_sum(xs, g, op), exact_sum(xs, g, op), N);
        }
        expect_bytes(comm, CollectiveKind::ReduceScatter, static_cast<double>(N * n * sizeof(T)));
      }
      // reduce to a root, which moves with n; the other ranks keep their buffers.
      {
        const int root = static_cast<int>((n + (op == ReduceOp::Avg)) % static_cast<std::size_t>(N));
        const auto xs = all_inputs<T>(N, n, s + 2);
        std::vector<T> buf = xs[static_cast<std::size_t>(r)];
        comm.reduce(std::span<T>(buf), root, op);
        for (std::size_t i = 0; i < n; ++i) {
          if (r == root) expect_bits("reduce", n, r, i, buf[i], rank_order_sum(xs, i, op), exact_sum(xs, i, op), N);
          else if (!same_bits(buf[i], xs[static_cast<std::size_t>(r)][i]))
            fail("reduce changed the buffer of non-root rank ", r, " at ", i);
        }
        expect_bytes(comm, CollectiveKind::Reduce, static_cast<double>(n * sizeof(T)));
      }
    }
    // all_gather: n in, N x n out.
    {
      const auto xs = all_inputs<T>(N, n, salt + 11);
      std::vector<T> out(n * static_cast<std::size_t>(N), static_cast<T>(-3.0f));
      comm.all_gather(std::span<const T>(xs[static_cast<std::size_t>(r)]), std::span<T>(out));
      for (int q = 0; q < N; ++q)
        for (std::size_t i = 0; i < n; ++i)
          if (!same_bits(out[n * static_cast<std::size_t>(q) + i], xs[static_cast<std::size_t>(q)][i]))
            fail("all_gather<", dtype_name_v<T>, ">: n=", n, " rank ", r, ": slice ", q, " index ", i, " is wrong");
      expect_bytes(comm, CollectiveKind::AllGather, static_cast<double>(N * n * sizeof(T)));
    }
    // broadcast from a root that moves with n.
    {
      const int root = static_cast<int>((n + 1) % static_cast<std::size_t>(N));
      const auto xs = all_inputs<T>(N, n, salt + 13);
      std::vector<T> buf = xs[static_cast<std::size_t>(r)];
      comm.broadcast(std::span<T>(buf), root);
      for (std::size_t i = 0; i < n; ++i)
        if (!same_bits(buf[i], xs[static_cast<std::size_t>(root)][i]))
          fail("broadcast<", dtype_name_v<T>, ">: n=", n, " root ", root, " rank ", r, " index ", i, " is wrong");
      expect_bytes(comm, CollectiveKind::Broadcast, static_cast<double>(n * sizeof(T)));
    }
  }
  comm.barrier();
  if (comm.stats().calls(CollectiveKind::Barrier) != 1 || comm.stats().bytes_sent(CollectiveKind::Barrier) != 0)
    fail("a barrier counts one call and no bytes");
}

/// Asynchronous forms: several collectives in flight at once, waited out of order, then a
/// blocking call that must run after them.
template <class Comm>
void check_async(Comm& comm) {
  const int N = comm.size();
  const int r = comm.rank();
  const std::size_t n = 1000, m = 37;
  const auto a_in = all_inputs<float>(N, n, 101);
  const auto b_in = all_inputs<bfloat16>(N, m * static_cast<std::size_t>(N), 102);
  const auto c_in = all_inputs<double>(N, m, 103);
  const auto d_in = all_inputs<half>(N, n, 104);
  std::vector<float> a = a_in[static_cast<std::size_t>(r)];
  std::vector<bfloat16> b_out(m);
  std::vector<double> c_out(m * static_cast<std::size_t>(N));
  std::vector<half> d = d_in[static_cast<std::size_t>(r)];

  CommHandle ha = comm.all_reduce_async(std::span<float>(a), ReduceOp::Avg);
  CommHandle hb = comm.reduce_scatter_async(std::span<const bfloat16>(b_in[static_cast<std::size_t>(r)]),
                                            std::span<bfloat16>(b_out), ReduceOp::Sum);
  CommHandle hc = comm.all_gather_async(std::span<const double>(c_in[static_cast<std::size_t>(r)]), std::span<double>(c_out));
  CommHandle hd = comm.broadcast_async(std::span<half>(d), N - 1);
  CommHandle he = comm.barrier_async();
  volatile double busy = 0;  // the compute that communication overlaps
  for (int i = 0; i < 10000; ++i) busy = busy + std::sqrt(static_cast<double>(i));
  he.wait();
  hc.wait();
  hd.wait();
  hb.wait();
  ha.wait();
  if (!ha.ready() || !he.ready()) fail("a waited handle is not ready");
  for (std::size_t i = 0; i < n; ++i)
    if (!same_bits(a[i], rank_order_sum(a_in, i, ReduceOp::Avg))) fail("async all_reduce wrong at ", i);
  for (std::size_t i = 0; i < m; ++i)
    if (!same_bits(b_out[i], rank_order_sum(b_in, m * static_cast<std::size_t>(r) + i, ReduceOp::Sum)))
      fail("async reduce_scatter wrong at ", i);
  for (int q = 0; q < N; ++q)
    for (std::size_t i = 0; i < m; ++i)
      if (c_out[m * static_cast<std::size_t>(q) + i] != c_in[static_cast<std::size_t>(q)][i])
        fail("async all_gather wrong at slice ", q, " index ", i);
  for (std::size_t i = 0; i < n; ++i)
    if (!same_bits(d[i], d_in[static_cast<std::size_t>(N - 1)][i])) fail("async broadcast wrong at ", i);

  // An async call left in flight, then a blocking one: they must run in issue order on every rank.
  std::vector<float> e(5, static_cast<float>(r + 1)), f(3, static_cast<float>(10 * (r + 1)));
  CommHandle he2 = comm.all_reduce_async(std::span<float>(e));
  comm.all_reduce(std::span<float>(f));
  he2.wait();
  const float tri = static_cast<float>(N * (N + 1) / 2);
  for (float v : e)
    if (v != tri) fail("async all_reduce before a blocking one: got ", v, ", want ", tri);
  for (float v : f)
    if (v != 10 * tri) fail("blocking all_reduce after an async one: got ", v, ", want ", 10 * tri);
}

/// Sub-groups: split by parity with reversed keys, and the two splits of hybrid sharding
/// (shard inside groups of two consecutive ranks, replicate across them).
template <class Comm>
void check_split(Comm& comm) {
  const int N = comm.size();
  const int r = comm.rank();
  Comm parity = comm.split(r % 2, N - r);
  std::vector<int> members;  // my parity, by descending world rank (the keys reverse the order)
  for (int q = N - 1; q >= 0; --q)
    if (q % 2 == r % 2) members.push_back(q);
  if (parity.size() != static_cast<int>(members.size())) fail("split by parity: size ", parity.size());
  if (members[static_cast<std::size_t>(parity.rank())] != r) fail("split by parity: rank ", parity.rank(), " for ", r);
  std::vector<double> who(static_cast<std::size_t>(parity.size()));
  const double me = r;
  parity.all_gather(std::span<const double>(&me, 1), std::span<double>(who));
  for (std::size_t i = 0; i < members.size(); ++i)
    if (who[i] != members[i]) fail("all_gather in the parity group: slot ", i, " holds ", who[i]);

  Comm inner = comm.split(r / 2, r);  // shard here
  Comm outer = comm.split(r % 2, r);  // replicate here
  std::vector<float> x{static_cast<float>(r + 1)};
  inner.all_reduce(std::span<float>(x));
  float want = 0;
  for (int q = 0; q < N; ++q)
    if (q / 2 == r / 2) want += static_cast<float>(q + 1);
  if (x[0] != want) fail("all_reduce in the inner group of rank ", r, ": got ", x[0], ", want ", want);
  std::vector<float> y{static_cast<float>(r + 1)};
  outer.all_reduce(std::span<float>(y));
  want = 0;
  for (int q = 0; q < N; ++q)
    if (q % 2 == r % 2) want += static_cast<float>(q + 1);
  if (y[0] != want) fail("all_reduce in the outer group of rank ", r, ": got ", y[0], ", want ", want);
  if (inner.stats().calls(CollectiveKind::AllReduce) != 1) fail("a sub-group counts its own calls");
  comm.barrier();
}

}  // namespace polyshard::test_comm
