# Conan 2 recipe of polyshard: a header-only library whose package carries its own CMake
# package config (find_package(polyshard CONFIG) -> polyshard::polyshard).
import os

from conan import ConanFile
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout


class PolyshardConan(ConanFile):
    name = "polyshard"
    version = "0.1.0"
    description = "Data-parallel training strategies (DDP, ZeRO, FSDP) as compositions of compile-time policies"
    topics = ("deep-learning", "distributed-training", "zero", "fsdp", "header-only")
    package_type = "header-library"
    # Settings drive the CMake install in package(); package_id() drops them: one package for all.
    settings = "os", "arch", "compiler", "build_type"
    exports_sources = "CMakeLists.txt", "cmake/*", "include/*"
    no_copy_source = True

    def requirements(self):
        # A host profile may satisfy these from the system with [platform_requires]
        # (Debian 12: eigen/3.4.0, boost/1.74.0, nlohmann_json/3.11.2); see .ci/conan-test.
        self.requires("eigen/3.4.0")
        self.requires("boost/[>=1.74.0 <2]")
        self.requires("nlohmann_json/[>=3.10.0 <4]")
        # No requirement on liburing: it is optional (NVMe offload only), and the package's own
        # CMake config looks for it on the consumer's machine (cmake/polyshardLiburing.cmake), so
        # the one header-only package serves machines with and without it.

    def layout(self):
        cmake_layout(self)

    def generate(self):
        tc = CMakeToolchain(self)
        for option in ("TESTS", "EXAMPLES", "BENCHMARKS"):
            tc.cache_variables[f"POLYSHARD_BUILD_{option}"] = False
        tc.cache_variables["POLYSHARD_ENABLE_MPI"] = False
        tc.cache_variables["POLYSHARD_ENABLE_CUDA"] = "OFF"
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        cmake = CMake(self)
        cmake.install()

    def package_id(self):
        self.info.clear()

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        # Consumers use the package's own config, which finds Eigen3, Boost and nlohmann-json itself: Conan's
        # generated config would omit find_dependency for platform requirements.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = [os.path.join("share", "cmake", "polyshard")]
