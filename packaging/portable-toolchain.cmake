# The portable build's compiler (scripts/release.sh): the host's clang compiling and linking against a Debian 11
# (bullseye, glibc 2.31) root as its sysroot, so every binary runs where glibc >= 2.31. clang takes the C++
# standard library from the root's GCC 10 installation (libstdc++ built for glibc 2.31, linked in statically by
# DDPRUN_PORTABLE); the root's /usr/local holds the C++ dependencies Debian 11 lacks or has too old (built from
# Debian 12's sources by scripts/release.sh). Needs DDPRUN_PORTABLE_ROOT: the root's path.
set(root "$ENV{DDPRUN_PORTABLE_ROOT}")
if(NOT root OR NOT EXISTS "${root}/usr/include/features.h")
  message(FATAL_ERROR "DDPRUN_PORTABLE_ROOT='${root}' is not a Debian root with glibc's headers; "
                      "scripts/release.sh builds it (/var/cache/ddprun/release/bullseye-build)")
endif()
set(CMAKE_SYSROOT "${root}")
set(CMAKE_C_COMPILER clang)
set(CMAKE_CXX_COMPILER clang++)
set(CMAKE_C_COMPILER_TARGET x86_64-linux-gnu)
set(CMAKE_CXX_COMPILER_TARGET x86_64-linux-gnu)
# Libraries, headers and CMake packages only from the root; programs (git, the compiler) from the host.
set(CMAKE_FIND_ROOT_PATH "${root}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
