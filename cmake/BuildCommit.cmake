# Writes OUT, a header defining DDPRUN_BUILD_COMMIT: the commit the source tree in SOURCE_DIR was built from
# (40 hex digits, " with local changes" when tracked files differ from it), $DDPRUN_BUILD_COMMIT when set (a
# source tree without .git: scripts/release.sh's, or a distribution's), else "unknown". Run at every build
# (cmake -P, launcher/CMakeLists.txt); OUT is rewritten only when the text changes, so an unchanged commit
# recompiles nothing.
if(DEFINED ENV{DDPRUN_BUILD_COMMIT} AND NOT "$ENV{DDPRUN_BUILD_COMMIT}" STREQUAL "")
  set(commit "$ENV{DDPRUN_BUILD_COMMIT}")
  if(NOT commit MATCHES "^[0-9A-Za-z ._+-]+$")
    message(FATAL_ERROR "DDPRUN_BUILD_COMMIT='${commit}': want a commit id (letters, digits, spaces, . _ + -)")
  endif()
else()
  set(commit "unknown")
  find_program(GIT git)
  if(GIT)
    execute_process(COMMAND ${GIT} -C ${SOURCE_DIR} rev-parse --verify HEAD RESULT_VARIABLE rc
                    OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(rc EQUAL 0 AND head MATCHES "^[0-9a-f]+$")
      set(commit "${head}")
      execute_process(COMMAND ${GIT} -C ${SOURCE_DIR} status --porcelain --untracked-files=no RESULT_VARIABLE rc
                      OUTPUT_VARIABLE changes ERROR_QUIET)
      if(rc EQUAL 0 AND NOT changes STREQUAL "")
        string(APPEND commit " with local changes")
      endif()
    endif()
  endif()
endif()
set(text "// Written by cmake/BuildCommit.cmake at build time; do not edit.\n#define DDPRUN_BUILD_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
