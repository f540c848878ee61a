# Runs the fairgate command once and checks how it ended (ctest -L cli).
#
#   cmake -DFAIRGATE=<path to fairgate> -DARGS="demo|--users|0" -DEXIT=2
#         [-DERR_LINES=1] [-DMATCH_OUT=<regex>] [-DMATCH_OUT_2=...] ... [-DMATCH_OUT_5=...]
#         [-DNO_MATCH_OUT=<regex>] [-DMATCH_ERR=<regex>] -P run_cli.cmake
#
# ARGS separates the arguments with '|'. Regexes are CMake regexes ([0-9], not \d).
# ERR_LINES checks the exact number of lines on stderr (api.md: a bad flag gives
# exactly one line).
cmake_minimum_required(VERSION 3.25)

if(NOT DEFINED FAIRGATE OR NOT DEFINED EXIT)
  message(FATAL_ERROR "run_cli.cmake: FAIRGATE and EXIT are required")
endif()
set(argv "")
if(DEFINED ARGS AND NOT ARGS STREQUAL "")
  string(REPLACE "|" ";" argv "${ARGS}")
endif()

execute_process(
  COMMAND "${FAIRGATE}" ${argv}
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  TIMEOUT 120)

set(problems "")
if(NOT rc STREQUAL "${EXIT}")
  string(APPEND problems "\n  exit code ${rc}, expected ${EXIT}")
endif()
if(DEFINED ERR_LINES)
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines n)
  string(LENGTH "${err}" err_len)
  string(REGEX MATCH "\n$" ends_with_newline "${err}")
  if(NOT n EQUAL ERR_LINES OR (err_len GREATER 0 AND NOT ends_with_newline))
    string(APPEND problems "\n  ${n} line(s) on stderr, expected ${ERR_LINES}")
  endif()
endif()
foreach(var MATCH_OUT MATCH_OUT_2 MATCH_OUT_3 MATCH_OUT_4 MATCH_OUT_5)
  if(DEFINED ${var} AND NOT "${out}" MATCHES "${${var}}")
    string(APPEND problems "\n  stdout does not match: ${${var}}")
  endif()
endforeach()
if(DEFINED NO_MATCH_OUT AND "${out}" MATCHES "${NO_MATCH_OUT}")
  string(APPEND problems "\n  stdout matches what it must not: ${NO_MATCH_OUT}")
endif()
if(DEFINED MATCH_ERR AND NOT "${err}" MATCHES "${MATCH_ERR}")
  string(APPEND problems "\n  stderr does not match: ${MATCH_ERR}")
endif()

if(problems)
  string(REPLACE ";" " " shown "${argv}")
  message(FATAL_ERROR "fairgate ${shown}:${problems}\n--- stdout ---\n${out}--- stderr ---\n${err}")
endif()
