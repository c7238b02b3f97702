# train(name args...): runs polyshard-train (PROGRAM) with ${common} and the arguments, writing
# metrics under WORK_DIR, and sets `name` to its logged losses as "step:loss" items and
# `name`_out to what it printed. A run that fails stops the script, except where --device cuda
# finds no usable GPU: that prints CTest's skip line ("SKIPPED: no CUDA device") and sets
# `name`_skipped.
function(train name)
  execute_process(COMMAND ${PROGRAM} ${common} ${ARGN} --metrics ${WORK_DIR}/${name}.jsonl
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 AND "${err}" MATCHES "--device cuda: rank [0-9]+ needs GPU [0-9]+ but")
    message("SKIPPED: no CUDA device: ${err}")
    set(${name}_skipped TRUE PARENT_SCOPE)
    return()
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "polyshard-train ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  file(STRINGS ${WORK_DIR}/${name}.jsonl lines)
  set(losses "")
  foreach(line IN LISTS lines)
    string(JSON step GET "${line}" step)
    string(JSON loss GET "${line}" loss)
    list(APPEND losses "${step}:${loss}")
  endforeach()
  set(${name} "${losses}" PARENT_SCOPE)
  set(${name}_out "${out}" PARENT_SCOPE)
endfunction()
