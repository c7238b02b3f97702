// Element types: names, sizes and conversions through the compute type.
#include <catch2/catch.hpp>

#include "polyshard/core/dtype.hpp"

using namespace polyshard;

TEST_CASE("dtype names and sizes match safetensors", "[core]") {
  STATIC_REQUIRE(dtype_name_v<float> == "F32");
  STATIC_REQUIRE(dtype_name_v<double> == "F64");
  STATIC_REQUIRE(dtype_name_v<half> == "F16");
  STATIC_REQUIRE(dtype_name_v<bfloat16> == "BF16");
  STATIC_REQUIRE(dtype_size(dtype_v<half>) == sizeof(half));
  STATIC_REQUIRE(dtype_size(dtype_v<bfloat16>) == 2);
  STATIC_REQUIRE(std::is_same_v<compute_t<bfloat16>, float>);
  STATIC_REQUIRE(std::is_same_v<compute_t<double>, double>);
}

TEST_CASE("16-bit casts round to nearest", "[core]") {
  // 1 + 2^-8 lies exactly between two bfloat16 values (8 significant bits): ties go to even.
  CHECK(static_cast<float>(element_cast<bfloat16>(1.0f + 1.0f / 256)) == 1.0f);
  CHECK(static_cast<float>(element_cast<bfloat16>(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
  CHECK(static_cast<float>(element_cast<half>(1.0f + 1.0f / 1024)) == 1.0f + 1.0f / 1024);
  CHECK(element_cast<double>(element_cast<half>(0.5f)) == 0.5);
}
