# ctest: calibrate the codecs, fit the link to MPI, plan the MLP of mpi_train with gradzip_plan,
# and run the plan under mpirun; the run must report its predicted and measured time.
# Variables: CALIBRATE, PLAN, TRAIN (executables), MPIEXEC (with its flags, a list), DATA, WORK.
file(MAKE_DIRECTORY ${WORK})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "failed (${status}): ${ARGN}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
run(${CALIBRATE} --quick --threads 1 --out ${WORK}/calibration.json)
run(${MPIEXEC} 2 ${TRAIN} --measure-link ${WORK}/link.json)
run(${PLAN} --model mlp --cpu-only --ranks 2 --samples 32 --calibration ${WORK}/calibration.json
    --link ${WORK}/link.json --plan-out ${WORK}/plan.json --cost-out ${WORK}/cost.json)
run(${MPIEXEC} 2 ${TRAIN} --data ${DATA} --epochs 1 --train 4000 --codecs plan
    --plan ${WORK}/plan.json --cost ${WORK}/cost.json)
if(NOT last_output MATCHES "synchronization per step: predicted [0-9.e+-]+ ms, measured [0-9.e+-]+ ms")
  message(FATAL_ERROR "the planned run did not report its predicted and measured time")
endif()
