// One code path for a whole tensor or any slice: slices, threads, alignment and 16-bit gradients
// must all give the bits of one whole update.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "optim/reference.hpp"
#include "polyshard/optim/optim.hpp"

using namespace polyshard;
using test::same_bits;

namespace {

enum class Kind { Sgd, SgdNesterov, Adam, AdamW };

std::string name(Kind k) {
  switch (k) {
    case Kind::Sgd: return "sgd";
    case Kind::SgdNesterov: return "sgd nesterov";
    case Kind::Adam: return "adam";
    case Kind::AdamW: return "adamw";
  }
  return "?";
}

// Parameters and optimizer state, placed `offset` elements into their allocations so that a
// nonzero offset makes every pointer misaligned for the SIMD width.
template <class P>
struct State {
  std::vector<P> storage_p, storage_m, storage_v;
  std::span<P> p, m, v;
  State(std::size_t n, std::size_t offset)
      : storage_p(n + offset), storage_m(n + offset), storage_v(n + offset),
        p(storage_p.data() + offset, n), m(storage_m.data() + offset, n), v(storage_v.data() + offset, n) {
    const auto init = test::values(n, 7);
    std::copy(init.begin(), init.end(), p.begin());
  }
};

template <class P, class G>
void apply(Kind kind, State<P>& s, std::size_t begin, std::size_t end, std::span<const G> grad, std::int64_t step) {
  const std::size_t count = end - begin;
  const auto p = s.p.subspan(begin, count);
  const auto g = grad.subspan(begin, count);
  const auto m = s.m.subspan(begin, count);
  const auto v = s.v.subspan(begin, count);
  switch (kind) {
    case Kind::Sgd:
      sgd_update<P, G>(p, g, m, {.lr = 0.1, .momentum = 0.9, .dampening = 0.2, .weight_decay = 0.01}, step);
      break;
    case Kind::SgdNesterov:
      sgd_update<P, G>(p, g, m, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}, step);
      break;
    case Kind::Adam:
      adam_update<P, G>(p, g, m, v, {.lr = 0.01, .weight_decay = 0.1}, step, false);
      break;
    case Kind::AdamW:
      adam_update<P, G>(p, g, m, v, {.lr = 0.01, .beta1 = 0.3, .weight_decay = 0.1}, step, true);
      break;
  }
}

template <class P>
void check_same(const State<P>& a, const State<P>& b) {
  CHECK(same_bits<P>(a.p, b.p));
  CHECK(same_bits<P>(a.m, b.m));
  CHECK(same_bits<P>(a.v, b.v));
}

// Restores the automatic thread count however the test ends.
struct ThreadsGuard {
  ~ThreadsGuard() { set_optimizer_threads(0); }
};

}  // namespace

TEMPLATE_TEST_CASE("updating a span in two slices gives the bits of updating it whole", "[optim][slicing]", float,
                   double) {
  using P = TestType;
  const Kind kind = GENERATE(Kind::Sgd, Kind::SgdNesterov, Kind::Adam, Kind::AdamW);
  const std::size_t n = 1000;
  const std::size_t cut = GENERATE(as<std::size_t>{}, 0, 1, 3, 7, 8, 15, 16, 17, 500, 513, 999, 1000);
  INFO(name(kind) << ", cut at " << cut);
  State<P> whole(n, 0), sliced(n, 1);  // the sliced copy also runs on misaligned pointers
  for (std::int64_t step = 1; step <= 4; ++step) {
    const std::vector<P> grad = test::cast<P>(test::values(n, 300 + static_cast<std::uint64_t>(step)));
    apply<P, P>(kind, whole, 0, n, grad, step);
    apply<P, P>(kind, sliced, 0, cut, grad, step);
    apply<P, P>(kind, sliced, cut, n, grad, step);
  }
  check_same(whole, sliced);
  // The update did happen: the result is not the initial values.
  CHECK_FALSE(same_bits<P>(whole.p, State<P>(n, 0).p));
}

TEMPLATE_TEST_CASE("the threaded split gives the bits of one thread and of uneven slices", "[optim][slicing]",
                   float, double) {
  using P = TestType;
  ThreadsGuard guard;
  const Kind kind = GENERATE(Kind::Sgd, Kind::AdamW);
  INFO(name(kind));
  const std::size_t n = 3 * (std::size_t{1} << 18) + 5;  // large enough for two threads
  State<P> threaded(n, 0), single(n, 3), sliced(n, 0);
  for (std::int64_t step = 1; step <= 2; ++step) {
    const std::vector<P> grad = test::cast<P>(test::values(n, 400 + static_cast<std::uint64_t>(step)));
    set_optimizer_threads(2);
    apply<P, P>(kind, threaded, 0, n, grad, step);
    set_optimizer_threads(1);
    apply<P, P>(kind, single, 0, n, grad, step);
    apply<P, P>(kind, sliced, 0, 12345, grad, step);
    apply<P, P>(kind, sliced, 12345, n / 2 + 3, grad, step);
    apply<P, P>(kind, sliced, n / 2 + 3, n, grad, step);
  }
  check_same(threaded, single);
  check_same(threaded, sliced);
}

TEMPLATE_TEST_CASE("16-bit and narrower gradients update as their values converted to the master type",
                   "[optim][slicing]", (std::pair<float, half>), (std::pair<float, bfloat16>),
                   (std::pair<double, float>), (std::pair<double, bfloat16>)) {
  using P = typename TestType::first_type;
  using G = typename TestType::second_type;
  const Kind kind = GENERATE(Kind::Sgd, Kind::Adam, Kind::AdamW);
  INFO(name(kind));
  const std::size_t n = 2500;  // several conversion chunks and a tail
  State<P> narrow(n, 0), converted(n, 0);
  for (std::int64_t step = 1; step <= 3; ++step) {
    const auto values = test::values(n, 500 + static_cast<std::uint64_t>(step));
    std::vector<G> grad(n);
    for (std::size_t i = 0; i < n; ++i) grad[i] = static_cast<G>(static_cast<float>(values[i]));
    std::vector<P> grad_p(n);
    for (std::size_t i = 0; i < n; ++i) grad_p[i] = element_cast<P>(grad[i]);
    apply<P, G>(kind, narrow, 0, 1234, grad, step);  // slices, to cross chunk boundaries unevenly
    apply<P, G>(kind, narrow, 1234, n, grad, step);
    apply<P, P>(kind, converted, 0, n, grad_p, step);
  }
  check_same(narrow, converted);
}

TEST_CASE("empty spans are a no-op", "[optim][slicing]") {
  std::span<float> none;
  std::span<const float> no_grad;
  CHECK_NOTHROW(sgd_update<float, float>(none, no_grad, none, {.momentum = 0.9}, 1));
  CHECK_NOTHROW(adam_update<float, float>(none, no_grad, none, none, {}, 1, true));
}
