# Finds liburing (io_uring's user-space library), which NVMe offload needs, and defines the
# imported target polyshard::liburing when it is there. Included by polyshard's own build and by
# its installed package config, so that a consumer's machine decides for itself.
if(TARGET polyshard::liburing)
  return()
endif()

# pkg-config first (it knows non-standard prefixes); the plain search covers systems without it.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(POLYSHARD_PC_LIBURING QUIET liburing)
endif()
find_path(POLYSHARD_LIBURING_INCLUDE_DIR liburing.h HINTS ${POLYSHARD_PC_LIBURING_INCLUDE_DIRS})
find_library(POLYSHARD_LIBURING_LIBRARY NAMES uring HINTS ${POLYSHARD_PC_LIBURING_LIBRARY_DIRS})
mark_as_advanced(POLYSHARD_LIBURING_INCLUDE_DIR POLYSHARD_LIBURING_LIBRARY)

if(POLYSHARD_LIBURING_INCLUDE_DIR AND POLYSHARD_LIBURING_LIBRARY)
  add_library(polyshard::liburing UNKNOWN IMPORTED)
  set_target_properties(polyshard::liburing PROPERTIES
    IMPORTED_LOCATION "${POLYSHARD_LIBURING_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${POLYSHARD_LIBURING_INCLUDE_DIR}")
endif()
