# cmake -DFAIRGATE=path/to/fairgate -DHELP2MAN=help2man -DOUT=fairgate.1 -DINCLUDE=man.h2m -P man_page.cmake
#
# fairgate.1 from `fairgate --help` (help2man), with each command's own
# --help as a subsection of COMMANDS and the hand-written sections of
# packaging/man.h2m (FILES, ENVIRONMENT, EXIT STATUS, SEE ALSO).
foreach(v FAIRGATE HELP2MAN OUT INCLUDE)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "man_page.cmake: -D${v}=... is required")
  endif()
endforeach()

set(commands "")
foreach(cmd serve mock-llm demo bench)
  execute_process(COMMAND ${FAIRGATE} ${cmd} --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "man_page.cmake: `fairgate ${cmd} --help` exited ${rc}")
  endif()
  # roff: a backslash is \e; a line starting with . or ' would be a request.
  string(REPLACE "\\" "\\e" help "${help}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" help "${help}")
  string(APPEND commands ".SS \"fairgate ${cmd}\"\n.nf\n${help}.fi\n")
endforeach()
file(READ ${INCLUDE} extra)
get_filename_component(dir ${OUT} DIRECTORY)
set(h2m ${dir}/fairgate.h2m)
file(WRITE ${h2m} "[COMMANDS]\nEach command has its own options; `fairgate COMMAND --help` prints them.\n${commands}\n${extra}")
execute_process(
  COMMAND ${HELP2MAN} --no-info --section=1 "--manual=User Commands"
          "--name=fair, cluster-wide concurrency limiter and admission server" --include=${h2m}
          --output=${OUT} ${FAIRGATE}
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "man_page.cmake: help2man failed (${rc}): ${err}")
endif()
