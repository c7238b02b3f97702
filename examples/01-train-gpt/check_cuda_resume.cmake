# Checkpoints of polyshard-train --device cuda: ZeRO-3 in bf16 on one GPU saved at step 3 and
# resumed on the GPU to step 6 logs the same losses, digit for digit, as 6 uninterrupted steps;
# the same checkpoint resumes on the host, and weights exported on the GPU (gathered through host
# memory or, without state_dict_to_cpu, on the device: the same file) start a host run.
# --parallel-devices LISTED_DEVICE (0 on a GPU, 3 on the emulated device's four) trains as GPU 0.
# Prints "SKIPPED: no CUDA device" (CTest's skip) where no GPU is usable.
set(common --layers 2 --heads 2 --embd 32 --seq 32 --batch 8 --log-every 100 --strategy zero3
           --precision bf16-mixed --world-size 1)
include(${CMAKE_CURRENT_LIST_DIR}/train_losses.cmake)

file(REMOVE_RECURSE ${WORK_DIR}/cuda-ckpt)
file(MAKE_DIRECTORY ${WORK_DIR})
train(whole --device cuda --steps 6)
if(whole_skipped)
  return()
endif()
train(first --device cuda --steps 3 --save ${WORK_DIR}/cuda-ckpt)
train(second --device cuda --steps 6 --resume ${WORK_DIR}/cuda-ckpt)
list(SUBLIST whole 3 3 expected)
if(NOT second STREQUAL expected)
  message(FATAL_ERROR "resumed on the GPU: losses ${second} differ from the uninterrupted run's ${expected}")
endif()
train(on_host --device cpu --steps 6 --resume ${WORK_DIR}/cuda-ckpt)
list(LENGTH on_host resumed_steps)
if(NOT resumed_steps EQUAL 3)
  message(FATAL_ERROR "the GPU's checkpoint resumed on the host logged ${on_host}, not steps 3 to 5")
endif()
train(exported --device cuda --steps 3 --export ${WORK_DIR}/cuda-weights.safetensors)
# Without state_dict_to_cpu the weights are gathered in device memory before rank 0 copies them
# down to write them: the same file, byte for byte.
train(exported_on_device --device cuda --steps 3 --state-dict-to-cpu false
      --export ${WORK_DIR}/cuda-weights-on-device.safetensors)
file(SHA256 ${WORK_DIR}/cuda-weights.safetensors through_host)
file(SHA256 ${WORK_DIR}/cuda-weights-on-device.safetensors through_device)
if(NOT through_host STREQUAL through_device)
  message(FATAL_ERROR "--state-dict-to-cpu false exported another file than the default")
endif()
train(started --device cpu --steps 1 --lr 1e-12 --init ${WORK_DIR}/cuda-weights.safetensors)
train(fresh --device cpu --steps 1 --lr 1e-12)
if(started STREQUAL fresh)
  message(FATAL_ERROR "--init of the GPU's weights changed nothing: ${started}")
endif()
# --parallel-devices: rank 0 on the GPU listed trains as on GPU 0 (emulated: on device 3 of 4), and
# a GPU beyond those visible is the device check's error, naming it: the list picks the device.
train(listed --device cuda --steps 6 --parallel-devices ${LISTED_DEVICE})
if(NOT listed STREQUAL whole)
  message(FATAL_ERROR "--parallel-devices ${LISTED_DEVICE}: losses ${listed} differ from GPU 0's ${whole}")
endif()
execute_process(COMMAND ${PROGRAM} ${common} --device cuda --steps 1 --parallel-devices 63
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "rank 0 needs GPU 63 but")
  message(FATAL_ERROR "--parallel-devices 63 did not reach the device check (${rc}): ${out}${err}")
endif()
message(STATUS "GPU resumed ${second} = ${expected}; on the host ${on_host}; init ${started} vs fresh ${fresh}")
