# Builds tests/package/consumer twice: once adding gradzip with FetchContent (from this source
# tree, no network), once with find_package after installing gradzip into a scratch prefix.
foreach(var GRADZIP_SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake needs -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
set(consumer "${GRADZIP_SOURCE_DIR}/tests/package/consumer")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
endfunction()

# 1. FetchContent
run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/fetch -G ${GENERATOR}
    -DCONSUMER_MODE=fetch -DGRADZIP_SOURCE_DIR=${GRADZIP_SOURCE_DIR})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/fetch)
run(${WORK_DIR}/fetch/consumer)
if(EXISTS ${WORK_DIR}/fetch/consumer_cuda)
  run(${WORK_DIR}/fetch/consumer_cuda)  # without a GPU it says so and succeeds
endif()

# 2. install + find_package
run(${CMAKE_COMMAND} -S ${GRADZIP_SOURCE_DIR} -B ${WORK_DIR}/gradzip-build -G ${GENERATOR}
    -DGRADZIP_BUILD_TESTS=OFF -DGRADZIP_BUILD_BENCHMARKS=OFF -DGRADZIP_BUILD_EXAMPLES=OFF
    -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${WORK_DIR}/gradzip-build)
run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/installed -G ${GENERATOR}
    -DCONSUMER_MODE=installed -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/installed)
run(${WORK_DIR}/installed/consumer)
if(EXISTS ${WORK_DIR}/installed/consumer_cuda)
  run(${WORK_DIR}/installed/consumer_cuda)
endif()
message(STATUS "consumer built and ran via FetchContent and via find_package")
