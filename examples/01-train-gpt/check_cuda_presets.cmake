# polyshard-train --device cuda against --device cpu: for each strategy in STRATEGIES (separated
# by commas) at WORLD ranks and PRECISION, the device engine logs the host engine's losses at
# every step, to the tolerance of the precision (relative: fp32 1e-5, fp16-mixed 5e-3, bf16-mixed 3e-2). Run with
# PROGRAM built for a GPU where there is one, or the emulated device's twin anywhere.
# Prints "SKIPPED: no CUDA device" (CTest's skip) where no GPU is usable.
if(PRECISION STREQUAL "fp32")
  set(tolerance_ppm 10)
elseif(PRECISION STREQUAL "fp16-mixed")
  set(tolerance_ppm 5000)
else()
  set(tolerance_ppm 30000)
endif()
set(common --layers 2 --heads 2 --embd 32 --seq 16 --batch 6 --steps 3 --log-every 1 --precision ${PRECISION}
           --world-size ${WORLD})
file(MAKE_DIRECTORY ${WORK_DIR}/nvme)
include(${CMAKE_CURRENT_LIST_DIR}/train_losses.cmake)


string(REPLACE "," ";" strategies "${STRATEGIES}")
foreach(strategy IN LISTS strategies)
  set(name ${strategy}_w${WORLD}_${PRECISION})
  set(where "")
  if(strategy STREQUAL "zero_infinity")  # the NVMe settings are refused where nothing reads them
    set(where --nvme-path ${WORK_DIR}/nvme)
  elseif(strategy STREQUAL "zero_infinity_parameters")  # every parameter shard in the file
    set(where --nvme-path ${WORK_DIR}/nvme --max-in-cpu 0 --params-buffer-count 2)
  endif()
  train(${name}_host --device cpu --strategy ${strategy} ${where})
  train(${name}_cuda --device cuda --strategy ${strategy} ${where})
  if(${name}_cuda_skipped)
    return()
  endif()
  list(LENGTH ${name}_host steps)
  list(LENGTH ${name}_cuda cuda_steps)
  if(steps EQUAL 0 OR NOT steps EQUAL cuda_steps)
    message(FATAL_ERROR "${name}: the host logged ${${name}_host}, the device ${${name}_cuda}")
  endif()
  foreach(host_item cuda_item IN ZIP_LISTS ${name}_host ${name}_cuda)
    string(REGEX REPLACE ".*:" "" host_loss "${host_item}")
    string(REGEX REPLACE ".*:" "" cuda_loss "${cuda_item}")
    decimal_to_integer(${host_loss} 9 h)  # in units of 1e-9
    decimal_to_integer(${cuda_loss} 9 c)
    math(EXPR difference "${h} - ${c}")
    if(difference LESS 0)
      math(EXPR difference "-${difference}")
    endif()
    math(EXPR allowed "${h} / 1000000 * ${tolerance_ppm}")
    if(difference GREATER allowed)
      message(FATAL_ERROR "${strategy} at ${WORLD} ranks, ${PRECISION}: the device engine logged ${cuda_item}, "
                          "the host engine ${host_item} (relative tolerance ${tolerance_ppm}e-6)")
    endif()
  endforeach()
  message(STATUS "${strategy} x${WORLD} ${PRECISION}: device ${${name}_cuda} = host ${${name}_host}")
endforeach()
