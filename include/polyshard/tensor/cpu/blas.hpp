// The host BLAS, loaded at run time: OpenBLAS when the machine has it, Eigen's own product
// otherwise. Loading it late (dlopen) keeps the library header-only with no link dependency,
// and lets OPENBLAS_CORETYPE be chosen before OpenBLAS reads it.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace polyshard::cpu {

/// Row-major GEMM entry points of a CBLAS, or null where none was found.
struct Blas {
  using sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                            float*, int);
  using dgemm_fn = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                            double*, int);
  using set_threads_fn = void (*)(int);
  using get_config_fn = char* (*)();

  static constexpr int row_major = 101;
  static constexpr int no_trans = 111;
  static constexpr int trans = 112;

  sgemm_fn sgemm = nullptr;
  dgemm_fn dgemm = nullptr;
  set_threads_fn set_threads = nullptr;
  std::string name = "eigen";

  bool available() const { return sgemm && dgemm; }
};

namespace detail {
inline Blas load_blas() {
  Blas blas;
  // POLYSHARD_BLAS: a library path to load instead, or "eigen" for Eigen's own product.
  const char* choice = std::getenv("POLYSHARD_BLAS");
  if (choice && std::string(choice) == "eigen") return blas;
  const char* candidates[] = {choice, "libopenblas.so.0", "libopenblas.so"};
  for (const char* lib : candidates) {
    if (!lib) continue;
    void* handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!handle) continue;
    blas.sgemm = reinterpret_cast<Blas::sgemm_fn>(dlsym(handle, "cblas_sgemm"));
    blas.dgemm = reinterpret_cast<Blas::dgemm_fn>(dlsym(handle, "cblas_dgemm"));
    blas.set_threads = reinterpret_cast<Blas::set_threads_fn>(dlsym(handle, "openblas_set_num_threads"));
    if (!blas.available()) {
      blas = Blas{};
      continue;
    }
    auto config = reinterpret_cast<Blas::get_config_fn>(dlsym(handle, "openblas_get_config"));
    blas.name = config ? config() : lib;
    return blas;
  }
  return blas;
}
}  // namespace detail

/// The process's BLAS, loaded on first use.
inline const Blas& blas() {
  static const Blas instance = detail::load_blas();
  return instance;
}

/// Threads the BLAS may use per call (in-process ranks each want a share of the cores).
inline void set_blas_threads(int threads) {
  if (blas().set_threads) blas().set_threads(threads);
}

}  // namespace polyshard::cpu
