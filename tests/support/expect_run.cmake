# Runs a program and checks how it ended as well as what it printed (cmake -P): CTest's
# PASS_REGULAR_EXPRESSION alone ignores the exit code, so a program that prints its success line
# and then crashes would pass. The program's output is printed whole, so that CTest's own
# SKIP_REGULAR_EXPRESSION still applies.
#
# Arguments (-D): COMMAND (the program and its arguments, joined with '|'), EXIT (0: it must
# succeed; nonzero: it must fail, by an exit code or a signal), PATTERN (a regular expression
# the output must match), SKIP_PATTERN (optional: output matching it ends the check here, as a
# skip, whatever the exit code).
cmake_minimum_required(VERSION 3.25)

foreach(arg COMMAND EXIT PATTERN)
  if(NOT DEFINED ${arg} OR "${${arg}}" STREQUAL "")
    message(FATAL_ERROR "expect_run.cmake: -D${arg}=... is required")
  endif()
endforeach()
if(NOT EXIT STREQUAL "0" AND NOT EXIT STREQUAL "nonzero")
  message(FATAL_ERROR "expect_run.cmake: EXIT must be '0' or 'nonzero', not '${EXIT}'")
endif()

string(REPLACE "|" ";" command "${COMMAND}")
execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
message("${output}")

if(DEFINED SKIP_PATTERN AND NOT SKIP_PATTERN STREQUAL "" AND output MATCHES "${SKIP_PATTERN}")
  return()
endif()
# `result` is the exit code, or a description of the signal that ended the program.
if(EXIT STREQUAL "0" AND NOT result STREQUAL "0")
  message(FATAL_ERROR "expect_run.cmake: ${command} ended with '${result}' where success was expected")
endif()
if(EXIT STREQUAL "nonzero" AND result STREQUAL "0")
  message(FATAL_ERROR "expect_run.cmake: ${command} exited with 0 where it should have failed")
endif()
if(NOT output MATCHES "${PATTERN}")
  message(FATAL_ERROR "expect_run.cmake: the output of ${command} does not match '${PATTERN}'")
endif()
