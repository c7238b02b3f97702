// Tensor views, copies and error messages.
#include <catch2/catch.hpp>

#include "polyshard/tensor/tensor.hpp"

using namespace polyshard;

TEST_CASE("views share storage: reshape, slice, flat_view, transpose", "[tensor]") {
  auto t = Tensor<float>::from({2, 3}, {0, 1, 2, 3, 4, 5});
  auto r = t.reshape({3, -1});
  CHECK(r.shape() == Shape{3, 2});
  r.at(2, 1) = 50;
  CHECK(t.at(1, 2) == 50);

  auto s = t.slice(1, 2);
  CHECK(s.shape() == Shape{1, 3});
  CHECK(s.at(0, 0) == 3);

  auto f = t.flat_view(2, 3);
  CHECK(f.to_vector() == std::vector<float>{2, 3, 4});

  auto tr = t.transpose();
  CHECK(tr.shape() == Shape{3, 2});
  CHECK_FALSE(tr.is_contiguous());
  CHECK(tr.is_transposed_contiguous());
  CHECK(tr.at(2, 0) == 2);
  CHECK(tr.contiguous().to_vector() == std::vector<float>{0, 3, 1, 4, 2, 50});
}

TEST_CASE("bad shapes give errors that name the shapes", "[tensor]") {
  auto t = Tensor<float>::zeros({2, 3});
  CHECK_THROWS_WITH(t.reshape({4, 2}), Catch::Contains("(2, 3)") && Catch::Contains("(4, 2)"));
  CHECK_THROWS_WITH(t.transpose().reshape({6}), Catch::Contains("not contiguous"));
  CHECK_THROWS_WITH(t.slice(1, 3), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(Tensor<float>::from({2}, {1, 2, 3}), Catch::Contains("(2,)"));
  auto u = Tensor<float>::zeros({3, 2});
  CHECK_THROWS_WITH(t.copy_from(u), Catch::Contains("(3, 2)") && Catch::Contains("(2, 3)"));
}

TEST_CASE("a view of released storage is an error to read, and reads again once materialized", "[tensor]") {
  auto t = Tensor<float>::from({4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const Tensor<float> rows = t.slice(1, 3);
  const Tensor<float> none = t.slice(2, 2);
  t.storage()->release();
  CHECK_FALSE(t.storage()->materialized());
  CHECK_THROWS_WITH(rows.data(), Catch::Contains("Tensor of shape (2, 3)") && Catch::Contains("released"));
  CHECK_THROWS_WITH(rows.span(), Catch::Contains("released"));
  CHECK_THROWS_WITH(t.clone(), Catch::Contains("released"));
  CHECK(none.data() == nullptr);  // no elements to read: nothing to point at, and no error
  t.storage()->materialize();
  CHECK(rows.data() == t.data() + 3);
  rows.span()[0] = 42;
  CHECK(t.at(1, 0) == 42);
}

TEST_CASE("clone copies a strided view into new storage", "[tensor]") {
  auto t = Tensor<double>::from({2, 2}, {1, 2, 3, 4});
  auto c = t.transpose().clone();
  t.fill(0);
  CHECK(c.to_vector() == std::vector<double>{1, 3, 2, 4});
}
