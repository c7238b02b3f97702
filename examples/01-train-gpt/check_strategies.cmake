# ZeRO-3 on 4 ranks learns as well as DDP on 1: the same global batches, the same losses up to
# the rounding of differently ordered sums; and the measured traffic and model state of every
# step equal the compile-time prediction, and the last step's peaks per category the predicted ones.
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
# The last step's peak per category (communication aside: the backend's scratch comes on top).
foreach(category parameters gradients optimizer_state working_copies other)
  string(JSON predicted GET "${zero3_last}" predicted peak_bytes ${category})
  string(JSON measured GET "${zero3_last}" ranks 3 peak_bytes ${category})
  if(NOT measured EQUAL predicted)
    message(FATAL_ERROR "rank 3 peak ${category} bytes: measured ${measured}, predicted ${predicted}")
  endif()
endforeach()
# Rank 0's activations, reported per unit: the root's and each block's.
string(JSON units LENGTH "${zero3_last}" activation_bytes)
if(units LESS 2)
  message(FATAL_ERROR "activation_bytes reports ${units} unit(s): ${zero3_last}")
endif()
# What rank 0 held while the engine was built: what it keeps; and with every shard on NVMe, one
# block's shard and AdamW state at a time, written to the file before the next block is built.
file(MAKE_DIRECTORY ${WORK_DIR}/nvme)
run_training(infinity --strategy zero_infinity_parameters --world-size 2 --nvme-path ${WORK_DIR}/nvme
             --max-in-cpu 0)
foreach(run zero3 infinity)
  foreach(category parameters gradients optimizer_state working_copies other)
    string(JSON predicted GET "${${run}_last}" predicted built_peak_bytes ${category})
    string(JSON measured GET "${${run}_last}" built_peak_bytes ${category})
    if(NOT measured EQUAL predicted)
      message(FATAL_ERROR "${run}: rank 0 built with ${measured} bytes of ${category}, predicted ${predicted}")
    endif()
  endforeach()
endforeach()
string(JSON zero3_state GET "${zero3_last}" built_peak_bytes optimizer_state)
string(JSON infinity_state GET "${infinity_last}" built_peak_bytes optimizer_state)
string(JSON infinity_shards GET "${infinity_last}" built_peak_bytes parameters)
string(JSON zero3_shards GET "${zero3_last}" built_peak_bytes parameters)
# zero3's four ranks each build a quarter of the model's state at once; zero_infinity_parameters's two,
# each with half of it, one block's at a time: less, with four blocks.
if(NOT infinity_state LESS zero3_state OR NOT infinity_shards LESS zero3_shards)
  message(FATAL_ERROR "zero_infinity_parameters x2 built with ${infinity_state} bytes of optimizer state and "
                      "${infinity_shards} of parameters, zero3 x4 with ${zero3_state} and ${zero3_shards}")
endif()
message(STATUS "zero3 x4 loss ${zero3_loss}, ddp x1 loss ${ddp_loss}; traffic, model state and step peaks as "
               "predicted; built, zero3 holds ${zero3_state} bytes of optimizer state, zero_infinity_parameters x2 "
               "${infinity_state}")
