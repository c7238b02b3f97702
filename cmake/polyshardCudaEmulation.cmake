# The emulated CUDA device (docs/cuda.md): polyshard's kernel sources compiled by the host
# compiler and run on the CPU under the CUDA execution model, behind the same CUDA runtime,
# cuBLASLt and NCCL calls, so that GPU code is developed and tested on a machine without a GPU.
# Slow, for tests; never part of a program that runs on GPUs.
#   polyshard_add_cuda_emulation(<name> <include root> [INITCHECK])
# makes a static library that a program links *instead of* polyshard_cuda, CUDA::cudart,
# CUDA::cublasLt and libnccl: the program's own objects are the same either way (they see only
# the CUDA headers), so one compilation serves a GPU build and an emulated one.
# Needs POLYSHARD_CUDA_SOURCES (polyshardCuda.cmake), find_package(CUDAToolkit) for the headers
# and Boost.Context (Debian: libboost-context-dev).
# INITCHECK: every load and store of the kernels is instrumented (GCC's outline kernel-address
# instrumentation, whose callbacks emulation/initcheck.cpp defines), so that a kernel's read of
# device memory nothing wrote stops the program naming the kernel, block and thread. Not beside
# ASan or TSan, which instrument the same accesses their own way.
find_package(Boost 1.74 REQUIRED COMPONENTS context)

function(polyshard_add_cuda_emulation name include_root)
  cmake_parse_arguments(PARSE_ARGV 2 arg "INITCHECK" "" "")
  set(sources "")
  set(kernel_units "")
  foreach(s IN LISTS POLYSHARD_CUDA_SOURCES)
    if(s MATCHES "/sort\\.cu$")
      continue()  # CUB is closed to the emulation: emulation/sort.cpp is its twin
    endif()
    # The same kernel text, seen by the host compiler as C++ (a .cu source is CUDA to CMake).
    get_filename_component(stem ${s} NAME_WE)
    set(unit ${CMAKE_CURRENT_BINARY_DIR}/${name}/${stem}.cpp)
    file(CONFIGURE OUTPUT ${unit} CONTENT "// ${s}, compiled by the host compiler for the emulated CUDA device.\n#include \"${s}\"\n")
    list(APPEND sources ${unit})
    list(APPEND kernel_units ${unit})
  endforeach()
  foreach(part grid runtime cublaslt nccl sort initcheck)
    list(APPEND sources ${include_root}/polyshard/emulation/${part}.cpp)
  endforeach()
  add_library(${name} STATIC ${sources})
  target_include_directories(${name} PUBLIC ${include_root} ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_features(${name} PUBLIC cxx_std_20)
  # As polyshard_cuda: no global `half` from cuda_fp16.h beside polyshard::half.
  target_compile_definitions(${name} PUBLIC CUDA_NO_HALF PRIVATE POLYSHARD_CUDA_EMULATION)
  # Kernels rely on CUDA's float semantics: a product and a sum are never fused into one FMA
  # unless written as one, and 16-byte packs are read through int4 (aliasing other types).
  target_compile_options(${name} PRIVATE -ffp-contract=off -fno-strict-aliasing -Wno-unknown-pragmas)
  target_link_libraries(${name} PUBLIC Boost::context Threads::Threads)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(arg_INITCHECK)
    target_compile_definitions(${name} PRIVATE POLYSHARD_EMULATION_INITCHECK)
    set_source_files_properties(${kernel_units} TARGET_DIRECTORY ${name} PROPERTIES COMPILE_OPTIONS
                                "${POLYSHARD_INITCHECK_FLAGS}")
  endif()
endfunction()

# The instrumentation of an initcheck build's kernels: a call at every access (no inline checks),
# none for the stack or globals, which the device's memory is not.
set(POLYSHARD_INITCHECK_FLAGS -fsanitize=kernel-address --param=asan-instrumentation-with-call-threshold=0
    --param=asan-stack=0 --param=asan-globals=0)
