# Included by the ctest scripts that build with clang++-14 (tests/fuzz, tests/sanitize): checks
# that every variable named in REQUIRED_VARS was given with -D, and sets CLANGXX, or exits 77
# (ctest: skipped) when clang++ is absent.
foreach(var ${REQUIRED_VARS})
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "${CMAKE_SCRIPT_MODE_FILE} needs -D${var}=...")
  endif()
endforeach()
find_program(CLANGXX NAMES clang++-14 clang++)
if(NOT CLANGXX)
  message("clang++ not found (Debian: apt-get install clang-14 libclang-rt-14-dev): skipping")
  cmake_language(EXIT 77)
endif()
