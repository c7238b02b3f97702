# Checks the policy lattice's predicate against the compiler on samples (cmake -P): runs SAMPLES
# (tests/fail/lattice/samples.cpp), then compiles composition.cpp for each sample with
# check_fail.cmake: a sample with a sentence must fail to compile printing it, one without must
# compile.
#
# Arguments (-D): SAMPLES (the program), CHECK_FAIL (check_fail.cmake), CXX, INCLUDES,
# SYSTEM_INCLUDES, IMPLICIT, PRELUDE (as check_fail.cmake takes them), DEFINES ('|'-joined macros
# the library's target defines, such as POLYSHARD_HAVE_LIBURING), SOURCE_DIR (the project's, whose
# git commit seeds the sample). The seed is the environment's POLYSHARD_LATTICE_SEED where set (to
# repeat a run's sample: the test prints its seed), else the commit's first 12 hex digits, else 0
# outside a git checkout.
cmake_minimum_required(VERSION 3.25)

foreach(arg SAMPLES CHECK_FAIL CXX INCLUDES)
  if(NOT DEFINED ${arg} OR "${${arg}}" STREQUAL "")
    message(FATAL_ERROR "check_lattice.cmake: -D${arg}=... is required")
  endif()
endforeach()

set(seed 0)
set(seed_from "no git checkout")
if(DEFINED ENV{POLYSHARD_LATTICE_SEED})
  set(seed "$ENV{POLYSHARD_LATTICE_SEED}")
  set(seed_from "POLYSHARD_LATTICE_SEED")
elseif(DEFINED SOURCE_DIR)
  execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse HEAD RESULT_VARIABLE git_rc OUTPUT_VARIABLE commit
                  ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(git_rc EQUAL 0 AND commit MATCHES "^[0-9a-f]+$")
    string(SUBSTRING "${commit}" 0 12 prefix)
    math(EXPR seed "0x${prefix}")
    set(seed_from "commit ${commit}")
  endif()
endif()
message(STATUS "sample seed ${seed} (${seed_from})")
execute_process(COMMAND "${SAMPLES}" "${seed}" RESULT_VARIABLE rc OUTPUT_VARIABLE listing ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${SAMPLES} failed (${rc}): ${err}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(checked 0)
set(rejected 0)
foreach(line IN LISTS lines)
  if(line STREQUAL "")
    continue()
  endif()
  string(REGEX MATCH "^([0-9]+)\t(.*)$" matched "${line}")
  if(NOT matched)
    message(FATAL_ERROR "unexpected line from ${SAMPLES}: '${line}'")
  endif()
  set(index "${CMAKE_MATCH_1}")
  set(sentence "${CMAKE_MATCH_2}")
  if(sentence STREQUAL "")
    set(mode compiles)
  else()
    set(mode rejected)
    math(EXPR rejected "${rejected} + 1")
  endif()
  execute_process(COMMAND "${CMAKE_COMMAND}" "-DCXX=${CXX}" "-DSOURCE=${CMAKE_CURRENT_LIST_DIR}/composition.cpp"
                          "-DMODE=${mode}" "-DEXPECT=${sentence}" "-DINCLUDES=${INCLUDES}"
                          "-DSYSTEM_INCLUDES=${SYSTEM_INCLUDES}" "-DIMPLICIT=${IMPLICIT}"
                          "-DDEFINES=${DEFINES}|POLYSHARD_LATTICE_INDEX=${index}" "-DPRELUDE=${PRELUDE}"
                          -P "${CHECK_FAIL}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "lattice composition ${index} (predicate: '${sentence}'):\n${out}")
  endif()
  message(STATUS "composition ${index}: ${mode} ${sentence}")
  math(EXPR checked "${checked} + 1")
endforeach()
if(rejected LESS 30)
  message(FATAL_ERROR "only ${rejected} rejected samples: the predicate or the sample listing is broken")
endif()
message(STATUS "${checked} lattice samples agree with the compiler (${rejected} rejected; seed ${seed})")
