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

# decimal_to_integer(value digits out): the plain decimal `value` (a loss) times 10^digits, as an
# integer in `out`: CMake's arithmetic is integer only.
function(decimal_to_integer value digits out)
  if(NOT value MATCHES "^([0-9]+)(\\.([0-9]*))?$")
    message(FATAL_ERROR "not a plain decimal: ${value}")
  endif()
  set(whole "${CMAKE_MATCH_1}")
  string(REPEAT "0" ${digits} zeros)
  set(fraction "${CMAKE_MATCH_3}${zeros}")
  string(SUBSTRING "${fraction}" 0 ${digits} fraction)
  string(REGEX REPLACE "^0+([0-9])" "\\1" fraction "${fraction}")
  set(scale "1${zeros}")
  math(EXPR result "${whole} * ${scale} + ${fraction}")
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# count_trace_events(file name out): how many events called `name` the Chrome trace `file`
# (polyshard-train --trace) holds, in `out`.
function(count_trace_events file name out)
  file(READ ${file} text)
  string(REGEX MATCHALL "\"name\": \"${name}\"" found "${text}")
  list(LENGTH found n)
  set(${out} ${n} PARENT_SCOPE)
endfunction()
