# Compiles SOURCE with -D${DEFINE} (e.g. ELEMENT=int, CASE=2); passes when compilation fails and
# its first "error:" line contains EXPECT.
execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only -D${DEFINE} -I${INCLUDE} ${SOURCE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "compiled, but ${DEFINE} must be refused")
endif()
string(REGEX MATCH "error: [^\n]*" first "${out}")
string(FIND "${first}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the first error is not the expected one.\nexpected: ${EXPECT}\nfirst: ${first}")
endif()
message(STATUS "refused as expected: ${first}")
