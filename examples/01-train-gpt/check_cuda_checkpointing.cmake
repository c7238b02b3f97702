# polyshard-train --device cuda --checkpoint-activations with DeepSpeed's cpu_checkpointing,
# contiguous_memory_optimization and synchronize_checkpoint_boundary against without them, under
# ZeRO-3 at WORLD ranks: the same losses to the last digit (the recomputation reads back exactly
# what it would have read on the device), and every block's input in host memory (layers x rows
# per rank x sequence x width floats), in one buffer after the first step; and without
# checkpoints, forward()'s refusal; with number_checkpoints, in the buffer from the first step.
# Run with PROGRAM built for a GPU where there is one, or the emulated device's twin.
# Prints "SKIPPED: no CUDA device" (CTest's skip) where no GPU is usable.
set(layers 2)
set(batch 6)
set(seq 16)
set(embd 32)
set(model --layers ${layers} --heads 2 --embd ${embd} --seq ${seq} --batch ${batch} --log-every 1
          --world-size ${WORLD} --device cuda --strategy zero3 --checkpoint-activations)
set(common ${model} --steps 3)
file(MAKE_DIRECTORY ${WORK_DIR})
include(${CMAKE_CURRENT_LIST_DIR}/train_losses.cmake)

train(kept)
if(kept_skipped)
  return()
endif()
train(offloaded --cpu-checkpointing true --contiguous-memory-optimization true --synchronize-checkpoint-boundary true)
if(NOT kept STREQUAL offloaded OR kept STREQUAL "")
  message(FATAL_ERROR "cpu_checkpointing changed the losses: kept on the device ${kept}, in host memory ${offloaded}")
endif()
math(EXPR rows "${batch} / ${WORLD}")
math(EXPR bytes "${layers} * ${rows} * ${seq} * ${embd} * 4")
# The last step's forward places them in the buffer the first step's measured.
string(CONCAT expected "cpu_checkpointing: ${layers} of ${layers} checkpointed blocks' inputs (${bytes} bytes) "
                       "waited in host memory, ${layers} of them in one buffer")
string(FIND "${offloaded_out}" "${expected}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "expected \"${expected}\" in:\n${offloaded_out}")
endif()
# One step: the first forward measures the buffer for the next; with number_checkpoints
# (DeepSpeed's) it is sized for that many inputs from the first forward on, so one step already
# places its inputs in it.
set(common ${model} --steps 1 --cpu-checkpointing true --contiguous-memory-optimization true)
foreach(slots 0 ${layers})
  if(slots EQUAL 0)
    train(one_step)
    set(placed 0)
  else()
    train(one_step --number-checkpoints ${slots})
    set(placed ${layers})
  endif()
  string(CONCAT said "waited in host memory, ${placed} of them in one buffer")
  string(FIND "${one_step_out}" "${said}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "number_checkpoints ${slots}, one step: expected \"${said}\" in:\n${one_step_out}")
  endif()
endforeach()
set(common ${model} --steps 3)
# Without checkpoints, the setting has nothing to act on: forward() says so.
list(REMOVE_ITEM common --checkpoint-activations)
execute_process(COMMAND ${PROGRAM} ${common} --cpu-checkpointing true RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "cpu_checkpointing acts on checkpointed blocks, and this forward checkpointed none")
  message(FATAL_ERROR "cpu_checkpointing without checkpoints: expected forward()'s refusal, got (${rc}):\n${out}\n${err}")
endif()
message(STATUS "cpu_checkpointing x${WORLD}: ${expected}; losses ${offloaded} as on the device")
