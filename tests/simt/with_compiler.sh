#!/bin/sh
# A CMake compiler and linker launcher that runs another compiler in the configured one's place:
#   with_compiler.sh COMPILER CONFIGURED-COMPILER ARGS...
# gradzip_simt_asan_tests uses it to build with clang++ inside the GCC build (CMake allows one C++
# compiler per build): clang places every static __shared__ variable in one section, so that the
# SIMT backend can poison them per block (tests/simt/gradzip_simt/device.hpp).
compiler=$1
shift 2
exec "$compiler" "$@"
