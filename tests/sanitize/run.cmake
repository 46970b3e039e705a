# Builds the host test suite with clang++-14 under AddressSanitizer and UndefinedBehaviorSanitizer
# (clang's UBSan also catches an offset applied to a null pointer, which GCC's does not) in a
# build of its own, then runs every test case. Exits 77 (ctest: skipped) when clang++-14 is absent.
set(REQUIRED_VARS SOURCE_DIR WORK_DIR GENERATOR)
include(${CMAKE_CURRENT_LIST_DIR}/../common/require_clang.cmake)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  message("${out}")
endfunction()

set(flags "-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all")
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=None
    -DCMAKE_CXX_COMPILER=${CLANGXX} "-DCMAKE_CXX_FLAGS=${flags}"
    -DGRADZIP_ENABLE_CUDA=OFF -DGRADZIP_BUILD_BENCHMARKS=OFF -DGRADZIP_BUILD_EXAMPLES=OFF)
run(${CMAKE_COMMAND} --build ${WORK_DIR} --target gradzip_host_tests)
# Without a report UBSan prints nothing; a finding fails the run (-fno-sanitize-recover).
run(${WORK_DIR}/tests/gradzip_host_tests)
