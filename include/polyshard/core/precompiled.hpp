// Precompiled instances: the float and double CPU kernels compiled once, into a static library,
// instead of in every translation unit that calls them.
//
// Opt-in, and the library stays header-only without it: a program that links a library made by
// polyshard_add_precompiled_library() (cmake/polyshardPrecompiled.cmake; polyshard's own tests,
// examples and benchmarks link `polyshard_precompiled`) compiles with POLYSHARD_PRECOMPILED
// defined. Each kernel header then declares its float and double instances `extern template`
// right after their definitions, so the compiler neither instantiates nor optimizes them in the
// caller's translation unit; the library's precompiled/*.cpp defines them. Half and bfloat16
// instances, and any other element type, are instantiated where they are used, as before.
//
// A kernel header lists its instances once, as a macro LIST(EXTERN, T) of explicit
// instantiations, and ends with POLYSHARD_DECLARE_PRECOMPILED(LIST).
#pragma once

#ifdef POLYSHARD_PRECOMPILED
#define POLYSHARD_DECLARE_PRECOMPILED(LIST) LIST(extern, float) LIST(extern, double)
#else
#define POLYSHARD_DECLARE_PRECOMPILED(LIST)
#endif

/// In precompiled/*.cpp: the explicit instantiation definitions of LIST.
#define POLYSHARD_DEFINE_PRECOMPILED(LIST) LIST(, float) LIST(, double)
