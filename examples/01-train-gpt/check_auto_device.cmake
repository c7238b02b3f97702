# polyshard-train --device auto (the default), as Lightning's accelerator="auto": on GPUs where
# every rank has one of its own and the run does not sample, else on the host; read from the
# "device" of each run's metrics. Run with the emulated device's twin, which has four GPUs.
set(model --layers 1 --embd 32 --heads 2 --seq 16 --batch 20 --steps 1 --log-every 100)
file(MAKE_DIRECTORY ${WORK_DIR})
set(failures "")

# picks(name expected arg...): runs PROGRAM with `model` and the arguments, no --device given.
function(picks name expected)
  set(metrics ${WORK_DIR}/${name}.jsonl)
  file(REMOVE ${metrics})
  execute_process(COMMAND ${PROGRAM} ${model} ${ARGN} --metrics ${metrics} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(device "")
  if(rc EQUAL 0 AND EXISTS ${metrics})
    file(STRINGS ${metrics} lines)
    list(GET lines 0 first)
    string(JSON device GET "${first}" device)
  endif()
  if(NOT device STREQUAL expected)
    string(JOIN " " command ${ARGN})
    set(failures "${failures}\n${name}: ${command} trained on '${device}', not ${expected} (exit ${rc}):\n${out}"
        PARENT_SCOPE)
  endif()
endfunction()

picks(two-ranks cuda --world-size 2)
picks(four-ranks cuda --world-size 4)
picks(five-ranks cpu --world-size 5)  # one rank would have no GPU
picks(listed cuda --world-size 2 --parallel-devices 3,1)
picks(listed-beyond cpu --world-size 2 --parallel-devices 3,4)  # there is no GPU 4
picks(sampling cpu --world-size 2 --sample-every 1 --sample-tokens 4)  # only host models sample
picks(explicit-cpu cpu --world-size 2 --device cpu)

if(failures)
  message(FATAL_ERROR "--device auto:${failures}")
endif()
message(STATUS "--device auto: cuda where every rank has a GPU and the run does not sample, else cpu")
