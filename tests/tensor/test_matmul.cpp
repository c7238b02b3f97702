// Matrix products against a naive triple loop, for every operand layout, through BLAS and Eigen.
#include <catch2/catch.hpp>

#include "support/finite_difference.hpp"
#include "polyshard/tensor/ops/matmul.hpp"

using namespace polyshard;

namespace {
Tensor<double> naive(const Tensor<double>& a, const Tensor<double>& b) {
  const auto batch = a.shape().leading(2);
  const auto m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Tensor<double> av = a.contiguous(), bv = b.contiguous();
  Shape out;
  for (int i = 0; i < a.rank() - 2; ++i) out.push_back(a.size(i));
  out.push_back(m);
  out.push_back(n);
  auto c = Tensor<double>::zeros(out);
  for (std::int64_t z = 0; z < batch; ++z)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t p = 0; p < k; ++p)
          s += av.data()[z * m * k + i * k + p] * bv.data()[(b.rank() == 2 ? 0 : z * k * n) + p * n + j];
        c.data()[z * m * n + i * n + j] = s;
      }
  return c;
}

double max_diff(const Tensor<double>& x, const Tensor<double>& y) {
  double d = 0;
  auto a = x.to_vector(), b = y.to_vector();
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}
}  // namespace

TEST_CASE("matmul matches the naive product for every layout", "[tensor]") {
  const auto [m, k, n] = GENERATE(std::tuple{1, 1, 1}, std::tuple{3, 5, 2}, std::tuple{7, 1, 4}, std::tuple{1, 6, 1},
                                  std::tuple{17, 9, 13});
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  const bool batched_b = GENERATE(false, true);
  CAPTURE(m, k, n, ta, tb, batched_b);
  // A (2, 3, m, k), possibly stored transposed.
  Tensor<double> a = ta ? test::random_tensor({2, 3, k, m}, 1).transpose() : test::random_tensor({2, 3, m, k}, 1);
  Shape bs = batched_b ? Shape{2, 3, tb ? n : k, tb ? k : n} : Shape{tb ? n : k, tb ? k : n};
  Tensor<double> b = tb ? test::random_tensor(bs, 2).transpose() : test::random_tensor(bs, 2);
  CHECK(max_diff(matmul(a, b), naive(a, b)) < 1e-12);
}

TEST_CASE("matmul accumulates with alpha and beta", "[tensor]") {
  auto a = test::random_tensor({4, 3}, 3), b = test::random_tensor({3, 5}, 4);
  auto c = test::random_tensor({4, 5}, 5);
  auto expected = naive(a, b);
  auto c0 = c.clone();
  matmul_into(a, b, c, 2.0, 1.0);
  for (std::int64_t i = 0; i < c.numel(); ++i)
    CHECK(c.data()[i] == Approx(2 * expected.data()[i] + c0.data()[i]).epsilon(1e-12));
}

TEST_CASE("matmul in float agrees with double", "[tensor]") {
  auto a = test::random_tensor({33, 65}, 6), b = test::random_tensor({65, 31}, 7);
  auto af = Tensor<float>::empty(a.shape()), bf = Tensor<float>::empty(b.shape());
  for (std::int64_t i = 0; i < a.numel(); ++i) af.data()[i] = float(a.data()[i]);
  for (std::int64_t i = 0; i < b.numel(); ++i) bf.data()[i] = float(b.data()[i]);
  auto cf = matmul(af, bf);
  auto cd = naive(a, b);
  for (std::int64_t i = 0; i < cd.numel(); ++i) CHECK(cf.data()[i] == Approx(cd.data()[i]).margin(1e-4));
}

TEST_CASE("matmul names both shapes when they do not fit", "[tensor]") {
  auto a = Tensor<float>::zeros({4, 3}), b = Tensor<float>::zeros({4, 5});
  CHECK_THROWS_WITH(matmul(a, b), Catch::Contains("matmul") && Catch::Contains("(4, 3)") && Catch::Contains("(4, 5)"));
}
