#!/usr/bin/env bash
# Copies the headers and CMake package files the GPU build needs (Eigen, Boost.Hana, Catch2, and
# CLI11 for polyshard-train) from this Debian machine into .gpu-deps/usr, keeping their /usr
# layout so that their package files find them again: a GPU machine with nvcc and CMake but none
# of these can then build polyshard with -DCMAKE_PREFIX_PATH=$PWD/.gpu-deps/usr
# (benchmarks/gpu/run.sh does). About 14 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
dst=.gpu-deps/usr
rm -rf .gpu-deps
arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
copy() { mkdir -p "$dst/$(dirname "$1")" && cp -a "/usr/$1" "$dst/$1"; }
copy include/eigen3
copy share/eigen3
copy include/boost/hana
copy include/boost/hana.hpp
copy include/boost/version.hpp
copy include/boost/config
copy include/boost/config.hpp
copy lib/$arch/cmake/Boost-1.74.0
copy lib/$arch/cmake/boost_headers-1.74.0
copy include/catch2
copy lib/cmake/Catch2
copy lib/libCatch2WithMain.a
copy include/CLI
copy share/cmake/CLI11
du -sh .gpu-deps
