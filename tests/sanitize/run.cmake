# Builds the host test suite with clang++-14 under a sanitizer in a build of its own, then runs
# every test case. Exits 77 (ctest: skipped) when clang++-14 is absent.
# SANITIZER=address: ASan and UBSan (clang's UBSan also catches an offset applied to a null
#   pointer, which GCC's does not).
# SANITIZER=thread: TSan, with OpenMP on, so the host executor's chunk_pool runs its helpers (its
#   atomics and the mutex are what TSan checks) and the multi-rank tests run their std::thread
#   ranks. libomp loads its TSan tool (Archer) itself, which tells TSan about the tests' OpenMP
#   loops (tools/common/synthetic_gradient.hpp); TSan must then ignore libomp's own accesses.
set(REQUIRED_VARS SOURCE_DIR WORK_DIR GENERATOR SANITIZER)
include(${CMAKE_CURRENT_LIST_DIR}/../common/require_clang.cmake)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  message("${out}")
endfunction()

if(SANITIZER STREQUAL "address")
  set(flags "-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all")
  set(env)
elseif(SANITIZER STREQUAL "thread")
  set(flags "-O1 -g -fsanitize=thread")
  # A report makes the run exit 66 after the last test (TSan's exitcode).
  set(env ${CMAKE_COMMAND} -E env TSAN_OPTIONS=ignore_noninstrumented_modules=1)
else()
  message(FATAL_ERROR "SANITIZER must be address or thread, got '${SANITIZER}'")
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=None
    -DCMAKE_CXX_COMPILER=${CLANGXX} "-DCMAKE_CXX_FLAGS=${flags}"
    -DGRADZIP_ENABLE_CUDA=OFF -DGRADZIP_BUILD_BENCHMARKS=OFF -DGRADZIP_BUILD_EXAMPLES=OFF)
run(${CMAKE_COMMAND} --build ${WORK_DIR} --target gradzip_host_tests)
# Without a report UBSan prints nothing; a finding fails the run (-fno-sanitize-recover).
run(${env} ${WORK_DIR}/tests/gradzip_host_tests)
