# Run at build time (cmake -DSRC=... -DOUT=... -P git_version.cmake): writes
# OUT, `#define MS_GIT "<git describe --always --dirty>"` of the checkout
# SRC, only when it changed, so `megascale --version` names the commit the
# binary was built from, not the one CMake was configured at, and an
# unchanged tree recompiles nothing.
execute_process(COMMAND git describe --always --dirty WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE git OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT git)
  set(git "unknown")
endif()
set(text "#define MS_GIT \"${git}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
