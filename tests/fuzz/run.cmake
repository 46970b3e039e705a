# Builds one decoder fuzz target of tests/fuzz/fuzz_targets.cpp with clang++-14 (libFuzzer, ASan,
# UBSan) and runs it for SECONDS from the valid payloads it writes itself plus the golden ones.
# An allocation above 512 MiB, 2 GiB of RSS, a 10 s input, an exception other than format_error
# or a sanitizer report is a finding and fails the test. Exits 77 (ctest: skipped) when
# clang++-14 is absent. tools/fuzz.sh runs the same targets long.
set(REQUIRED_VARS SOURCE_DIR WORK_DIR TARGET NAME SECONDS)
include(${CMAKE_CURRENT_LIST_DIR}/../common/require_clang.cmake)
set(dir ${WORK_DIR}/${NAME})
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir}/corpus)
file(GLOB golden ${SOURCE_DIR}/tests/golden/*.grdz)
file(COPY ${golden} DESTINATION ${dir}/corpus)
execute_process(
  COMMAND ${CLANGXX} -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
          -DGRADZIP_FUZZ_TARGET=${TARGET} -I${SOURCE_DIR}/include ${SOURCE_DIR}/tests/fuzz/fuzz_targets.cpp
          -o ${dir}/fuzz_${NAME}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building fuzz target ${NAME} failed:\n${out}")
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env GRADZIP_FUZZ_SEEDS=${dir}/corpus
          ${dir}/fuzz_${NAME} -max_total_time=${SECONDS} -max_len=8192 -rss_limit_mb=2048
          -malloc_limit_mb=512 -timeout=10 -print_final_stats=1 ${dir}/corpus
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fuzz target ${NAME} found a failure:\n${out}")
endif()
string(REGEX MATCH "stat::number_of_executed_units: [0-9]+" runs "${out}")
message("fuzz_${NAME}: ${runs}")
