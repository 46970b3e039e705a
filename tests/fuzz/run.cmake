# Builds the decoder fuzz target with clang++-14 (libFuzzer + ASan + UBSan) and runs it for a
# bounded time from the golden payloads. Exits 77 (ctest: skipped) when clang++-14 is absent.
find_program(CLANGXX NAMES clang++-14 clang++)
if(NOT CLANGXX)
  message("clang++ not found (Debian: apt-get install clang-14 libclang-rt-14-dev): skipping")
  cmake_language(EXIT 77)
endif()
file(MAKE_DIRECTORY ${WORK_DIR}/corpus)
file(GLOB seeds ${SOURCE_DIR}/tests/golden/*.grdz)
file(COPY ${seeds} DESTINATION ${WORK_DIR}/corpus)
execute_process(
  COMMAND ${CLANGXX} -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined
          -fno-sanitize-recover=undefined -I${SOURCE_DIR}/include
          ${SOURCE_DIR}/tests/fuzz/fuzz_decode.cpp -o ${WORK_DIR}/fuzz_decode
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the fuzz target failed:\n${out}")
endif()
execute_process(
  COMMAND ${WORK_DIR}/fuzz_decode -max_total_time=${SECONDS} -max_len=4096 -print_final_stats=1
          ${WORK_DIR}/corpus
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the fuzzer found a failure:\n${out}")
endif()
string(REGEX MATCH "stat::number_of_executed_units: [0-9]+" runs "${out}")
message("fuzz_decode: ${runs}")
