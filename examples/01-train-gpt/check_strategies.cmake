# ZeRO-3 on 4 ranks learns as well as DDP on 1: the same global batches, the same losses up to
# the rounding of differently ordered sums; and the measured traffic and model state of every
# step equal the compile-time prediction.
function(run_training name)
  execute_process(COMMAND ${PROGRAM} --steps 40 --log-every 40 ${ARGN} --metrics ${WORK_DIR}/${name}.jsonl
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "polyshard-train ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  file(STRINGS ${WORK_DIR}/${name}.jsonl lines)
  list(GET lines -1 last)
  string(JSON loss GET "${last}" loss)
  set(${name}_loss ${loss} PARENT_SCOPE)
  set(${name}_last "${last}" PARENT_SCOPE)
endfunction()

run_training(ddp --strategy ddp --world-size 1)
run_training(zero3 --strategy zero3 --world-size 4)
include(${CMAKE_CURRENT_LIST_DIR}/train_losses.cmake)  # decimal_to_integer
decimal_to_integer(${ddp_loss} 6 ddp)  # in millionths
decimal_to_integer(${zero3_loss} 6 zero3)
math(EXPR difference "${ddp} - ${zero3}")
if(difference LESS 0)
  math(EXPR difference "-${difference}")
endif()
math(EXPR allowed "${ddp} / 1000")
if(difference GREATER allowed)
  message(FATAL_ERROR "zero3 on 4 ranks ended at loss ${zero3_loss}, ddp on 1 at ${ddp_loss}")
endif()

foreach(field bytes_sent model_state_bytes)
  string(JSON predicted GET "${zero3_last}" predicted ${field})
  if(field STREQUAL "bytes_sent")
    string(JSON measured GET "${zero3_last}" ranks 3 bytes_sent total)
  else()
    string(JSON measured GET "${zero3_last}" ranks 3 model_state_bytes)
  endif()
  if(NOT measured EQUAL predicted)
    message(FATAL_ERROR "rank 3 ${field}: measured ${measured}, predicted ${predicted}")
  endif()
endforeach()
message(STATUS "zero3 x4 loss ${zero3_loss}, ddp x1 loss ${ddp_loss}; traffic and model state as predicted")
