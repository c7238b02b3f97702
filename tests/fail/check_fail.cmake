# Runs one compile-failure case (cmake -P): MODE=compiles checks that SOURCE compiles as written;
# MODE=rejected checks that it does not compile with -DPOLYSHARD_FAIL and that the compiler
# prints the sentence on the file's `// expect: <sentence>` line. MODE=precompile compiles the
# header SOURCE into the precompiled header OUTPUT (and its dependency file OUTPUT.d), with the
# flags the cases are compiled with, as the build does for tests/fail/prelude.hpp.
#
# Arguments (-D): CXX (the compiler), SOURCE (the case), MODE (compiles | rejected | precompile,
# which takes OUTPUT), INCLUDES (the project's include directories), SYSTEM_INCLUDES and IMPLICIT
# (the compiler's own include directories, left out), each list joined with '|'. Optional:
# EXPECT, the sentence, in place of the file's `// expect:` line (for sources compiled for
# several cases, as tests/fail/lattice); DEFINES, macros to define, joined with '|'; PRELUDE, a
# header put before the case with -include, whose precompiled PRELUDE.gch GCC reads in its place
# where the flags match (left out for a case that defines or undefines a macro before its
# includes: the header would already have been read without that macro).
cmake_minimum_required(VERSION 3.25)

foreach(arg CXX SOURCE MODE INCLUDES)
  if(NOT DEFINED ${arg} OR "${${arg}}" STREQUAL "")
    message(FATAL_ERROR "check_fail.cmake: -D${arg}=... is required")
  endif()
endforeach()
if(NOT MODE MATCHES "^(compiles|rejected|precompile)$")
  message(FATAL_ERROR "check_fail.cmake: MODE must be 'compiles', 'rejected' or 'precompile', not '${MODE}'")
endif()
if(MODE STREQUAL "precompile" AND (NOT DEFINED OUTPUT OR OUTPUT STREQUAL ""))
  message(FATAL_ERROR "check_fail.cmake: MODE=precompile needs -DOUTPUT=<the .gch to write>")
endif()

# The expected sentence: EXPECT, or the text after `// expect: ` on its own line.
if(DEFINED EXPECT)
  set(expect "${EXPECT}")
elseif(MODE STREQUAL "precompile")
  set(expect "")
else()
  file(STRINGS "${SOURCE}" expect_lines REGEX "^// expect: ")
  list(LENGTH expect_lines n_expect)
  if(NOT n_expect EQUAL 1)
    message(FATAL_ERROR "${SOURCE}: needs exactly one line `// expect: <part of the static_assert message>`, "
                        "found ${n_expect}")
  endif()
  string(REGEX REPLACE "^// expect: " "" expect "${expect_lines}")
  string(STRIP "${expect}" expect)
endif()
if(expect STREQUAL "" AND MODE STREQUAL "rejected")
  message(FATAL_ERROR "${SOURCE}: no expected sentence (the `// expect:` line or EXPECT is empty)")
endif()

# Include flags: ours with -I, third-party ones with -isystem, the compiler's own left out (an
# explicit -I/usr/include breaks libstdc++'s #include_next).
string(REPLACE "|" ";" includes "${INCLUDES}")
string(REPLACE "|" ";" system_includes "${SYSTEM_INCLUDES}")
string(REPLACE "|" ";" implicit "${IMPLICIT}")
set(flags -std=c++20)
foreach(dir IN LISTS includes)
  list(APPEND flags "-I${dir}")
endforeach()
list(REMOVE_DUPLICATES system_includes)
foreach(dir IN LISTS system_includes)
  if(NOT dir STREQUAL "" AND NOT dir IN_LIST implicit)
    list(APPEND flags -isystem "${dir}")
  endif()
endforeach()
if(MODE STREQUAL "rejected")
  list(APPEND flags -DPOLYSHARD_FAIL)
endif()
string(REPLACE "|" ";" defines "${DEFINES}")
foreach(define IN LISTS defines)
  if(NOT define STREQUAL "")
    list(APPEND flags "-D${define}")
  endif()
endforeach()

set(ENV{LC_ALL} C)  # plain quotes in diagnostics
if(MODE STREQUAL "precompile")
  execute_process(COMMAND "${CXX}" ${flags} -x c++-header "${SOURCE}" -o "${OUTPUT}"
                          -MD -MF "${OUTPUT}.d" -MT "${OUTPUT}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${SOURCE} did not precompile:\n${out}")
  endif()
  return()
endif()
list(APPEND flags -fsyntax-only)
if(DEFINED PRELUDE AND NOT PRELUDE STREQUAL "")
  file(STRINGS "${SOURCE}" own_macros REGEX "^[ \t]*#[ \t]*(define|undef)")
  if(NOT own_macros)
    # -Winvalid-pch: where the precompiled header does not fit the flags, the output says why (and
    # the case still compiles, from the header's text).
    list(APPEND flags -Winvalid-pch -include "${PRELUDE}")
  endif()
endif()
execute_process(COMMAND "${CXX}" ${flags} "${SOURCE}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)

if(MODE STREQUAL "compiles")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${SOURCE} must compile without POLYSHARD_FAIL, but the compiler said:\n${out}")
  endif()
  message(STATUS "${SOURCE}: compiles without POLYSHARD_FAIL")
else()
  if(rc EQUAL 0)
    message(FATAL_ERROR "${SOURCE} must not compile with POLYSHARD_FAIL, but it did")
  endif()
  string(FIND "${out}" "${expect}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${SOURCE} failed to compile with POLYSHARD_FAIL, as it must, but the compiler output "
                        "lacks the expected sentence\n  \"${expect}\"\nIt said:\n${out}")
  endif()
  message(STATUS "${SOURCE}: rejected with \"${expect}\"")
endif()
