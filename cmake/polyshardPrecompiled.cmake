# polyshard's precompiled instances (opt-in; the library stays header-only without them): the
# float and double CPU kernels compiled once into a static library, so that the translation
# units of a program that links it (and so compiles with POLYSHARD_PRECOMPILED) declare them
# extern instead of compiling them again, each. See include/polyshard/core/precompiled.hpp.
#   polyshard_add_precompiled_library(<name> <include root>)
# then target_link_libraries(<program> PRIVATE <name>). Compile it with the program's flags
# (optimization, -march, sanitizers): it is the code those programs run.
set(POLYSHARD_PRECOMPILED_SOURCES
  polyshard/tensor/ops/precompiled.cpp
  polyshard/autograd/precompiled.cpp)

function(polyshard_add_precompiled_library name include_root)
  set(sources "")
  foreach(s IN LISTS POLYSHARD_PRECOMPILED_SOURCES)
    list(APPEND sources ${include_root}/${s})
  endforeach()
  add_library(${name} STATIC ${sources})
  target_link_libraries(${name} PUBLIC polyshard::polyshard)
  target_compile_definitions(${name} PUBLIC POLYSHARD_PRECOMPILED)
endfunction()
