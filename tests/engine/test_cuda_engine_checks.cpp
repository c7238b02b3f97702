// Host-side checks of the unit kernels, run on every machine (no GPU needed).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "polyshard/engine/cuda/unit_kernels.hpp"

using namespace polyshard;

TEST_CASE("validate_unit_table rejects entries past the end and overlapping entries", "[cuda][engine]") {
  using Catch::Matchers::Contains;
  float* t = reinterpret_cast<float*>(std::uintptr_t{256});  // never dereferenced
  using E = cuda::UnitEntry<float>;
  CHECK(cuda::validate_unit_table<float>(std::vector<E>{{t, 0, 4}, {t, 4, 6}, {nullptr, 3, 0}}, 10) == 10);
  CHECK_THROWS_WITH(cuda::validate_unit_table<float>(std::vector<E>{{t, 0, 4}, {t, 8, 3}}, 10, "pack"),
                    Contains("pack: entry 1 (offset 8, numel 3) ends past the flat buffer of 10 elements"));
  CHECK_THROWS_WITH(cuda::validate_unit_table<float>(std::vector<E>{{t, 5, 4}, {t, 0, 6}}, 10, "pack"),
                    Contains("pack: entry 1 (offset 0, numel 6) overlaps entry 0 (offset 5)"));
  CHECK_THROWS_WITH(cuda::validate_unit_table<float>(std::vector<E>{{nullptr, 0, 4}}, 10, "pack"),
                    Contains("entry 0 has 4 elements and no tensor"));
}
