# polyshard's CUDA kernels: the library stays header-only for its C++ users; its kernels are
# .cu files under include/polyshard/ (beside the headers that declare their launchers), which a
# program that runs on GPUs compiles once into a static library:
#   polyshard_add_cuda_library(<name> <include root>)
# Needs enable_language(CUDA) and find_package(CUDAToolkit) first. The .cu files include no
# Eigen and no Boost.Hana, so they compile fast; each instantiates its kernels for the element
# types the strategies use (float, half, bfloat16).
# CMake 3.25 does not know nvcc's C++20 flag; the kernels are C++20.
if(CMAKE_VERSION VERSION_LESS 3.26)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()

set(POLYSHARD_CUDA_SOURCES
  polyshard/tensor/cuda/tensor_kernels.cu
  polyshard/tensor/cuda/transformer_kernels.cu
  polyshard/tensor/cuda/flash_attention.cu
  polyshard/tensor/cuda/sort.cu
  polyshard/optim/cuda/fused_optimizers.cu
  polyshard/engine/cuda/unit_kernels.cu)

function(polyshard_add_cuda_library name include_root)
  set(sources "")
  foreach(s IN LISTS POLYSHARD_CUDA_SOURCES)
    list(APPEND sources ${include_root}/${s})
  endforeach()
  add_library(${name} STATIC ${sources})
  target_include_directories(${name} PUBLIC ${include_root})
  target_link_libraries(${name} PUBLIC CUDA::cudart CUDA::cublasLt)
  target_compile_features(${name} PUBLIC cxx_std_20)
  # cuda_fp16.h (pulled in by cublasLt.h) would declare a global `half` that clashes with
  # polyshard::half in code that says `using namespace polyshard`.
  target_compile_definitions(${name} PUBLIC CUDA_NO_HALF)
  # Line tables for profilers; no fast-math: the kernels must agree with their CPU twins.
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr -Xcudafe --display_error_number>)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_SEPARABLE_COMPILATION OFF)
endfunction()
