# Where the build finds what it builds against, read anew at every configure (a changed environment variable is
# honoured by the next build; nothing derived from the environment is written into the CMake cache):
#   dcnkit_path_setting(VAR DOC)  VAR = $ENV{VAR} when that is set, else the cache entry VAR (-DVAR=...)
#   dcnkit_ort_headers(OUT_VAR)   the ONNX Runtime C/C++ headers: DCNKIT_ORT_INCLUDE_DIR, else fetched the way
#                                 scripts/setup.sh does (scripts/ort_headers.sh into <source>/.deps), else one
#                                 FATAL_ERROR line saying how to provide them (or to build with DCNKIT_BUILD_ORT=OFF)

function(dcnkit_path_setting var doc)
  set(${var} "" CACHE PATH "${doc} (the environment variable ${var} wins over this entry)")
  if(DEFINED ENV{${var}} AND NOT "$ENV{${var}}" STREQUAL "")
    set(${var} "$ENV{${var}}" PARENT_SCOPE)  # a normal variable over the cache entry: never cached
  endif()
endfunction()

function(dcnkit_ort_headers out_var)
  dcnkit_path_setting(DCNKIT_ORT_INCLUDE_DIR "ONNX Runtime C/C++ API headers (the folder with onnxruntime_cxx_api.h)")
  # The script validates a given folder (nothing fetched then) or fetches Debian's libonnxruntime-dev headers.
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -E env "DCNKIT_ORT_INCLUDE_DIR=${DCNKIT_ORT_INCLUDE_DIR}"
            bash "${PROJECT_SOURCE_DIR}/scripts/ort_headers.sh" "${PROJECT_SOURCE_DIR}/.deps" "${Python_EXECUTABLE}"
    OUTPUT_VARIABLE _inc ERROR_VARIABLE _err RESULT_VARIABLE _rc
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0 OR NOT EXISTS "${_inc}/onnxruntime_c_api.h")
    string(REGEX REPLACE ".*\n" "" _why "${_err}")  # the script's last line says what to provide
    string(REGEX REPLACE "^\\[ort-headers\\] (error: )?" "" _why "${_why}")
    if(_why STREQUAL "")
      set(_why "scripts/ort_headers.sh gave no include folder (exit ${_rc})")
    endif()
    # The leading space keeps CMake from wrapping the line.
    message(FATAL_ERROR " dcnkit: no ONNX Runtime headers for the ONNX Runtime library: ${_why}; "
                        "or leave the library out with -DDCNKIT_BUILD_ORT=OFF")
  endif()
  if(NOT _err STREQUAL "")
    message(STATUS "${_err}")
  endif()
  set(${out_var} "${_inc}" PARENT_SCOPE)
endfunction()
