# The CPU GEMM of the runtime adapters whose kernels run in the runtime's own thread pool (ONNX Runtime, OpenVINO):
# plugins/core/src/cpu_gemm/ (dcnkit/cpu_gemm.h). OpenBLAS from the scipy-openblas32 wheel in the build's Python
# environment (linked), and oneDNN 3.x for the packed weights, loaded at run time (no link dependency; its C API's
# prototypes from the onednn-devel-cpu-gomp wheel's headers in that environment, when there).
#   dcnkit_onednn_gemm()  makes the static target dcnkit_onednn_gemm the first time: the packed-operand GEMM on oneDNN
#                         alone (no OpenBLAS), which the PyTorch library uses beside libtorch's BLAS.
#   dcnkit_cpu_gemm()     sets DCNKIT_OPENBLAS_INCLUDE_DIR, DCNKIT_OPENBLAS_LIB_DIR, DCNKIT_OPENBLAS_LIBRARY and makes the
#                         static target dcnkit_cpu_gemm (OpenBLAS + dcnkit_onednn_gemm) the first time; FATAL_ERROR
#                         when scipy-openblas32 is missing.

function(dcnkit_onednn_gemm)
  if(TARGET dcnkit_onednn_gemm)
    return()
  endif()
  set(_src "${PROJECT_SOURCE_DIR}/plugins/core/src/cpu_gemm")
  add_library(dcnkit_onednn_gemm STATIC "${_src}/onednn_lib.cpp" "${_src}/onednn_packed_gemm.cpp"
                                        "${_src}/packed_gemm.cpp")
  target_include_directories(dcnkit_onednn_gemm PUBLIC "${PROJECT_SOURCE_DIR}/plugins/core/include")
  target_compile_features(dcnkit_onednn_gemm PUBLIC cxx_std_17)
  target_compile_options(dcnkit_onednn_gemm PRIVATE -Wall -Wextra -O3)
  target_link_libraries(dcnkit_onednn_gemm PUBLIC ${CMAKE_DL_LIBS})
  # A library using it stays loaded once loaded (ONNX Runtime closes a custom-op library with its session options):
  # what it keeps per process (oneDNN's engine, the one-line notice without oneDNN) is made once per process.
  target_link_options(dcnkit_onednn_gemm INTERFACE "LINKER:-z,nodelete")
  # oneDNN 3.x headers (pip onednn-devel-cpu-gomp: <prefix>/include/oneapi/dnnl); without them nothing is packed.
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "import sysconfig; print(sysconfig.get_paths()['data'])"
                  OUTPUT_VARIABLE _prefix OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(DCNKIT_ONEDNN3_INCLUDE_DIR "${_prefix}/include" CACHE PATH "Folder of oneDNN 3.x's oneapi/dnnl/dnnl.h")
  if(EXISTS "${DCNKIT_ONEDNN3_INCLUDE_DIR}/oneapi/dnnl/dnnl.h")
    file(STRINGS "${DCNKIT_ONEDNN3_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _major REGEX "define DNNL_VERSION_MAJOR")
    if(_major MATCHES "MAJOR 3")
      target_compile_definitions(dcnkit_onednn_gemm PRIVATE DCNKIT_WITH_ONEDNN3_HEADERS=1)
      target_include_directories(dcnkit_onednn_gemm SYSTEM PRIVATE "${DCNKIT_ONEDNN3_INCLUDE_DIR}")
      message(STATUS "dcnkit: packed CPU GEMM on oneDNN 3.x (headers ${DCNKIT_ONEDNN3_INCLUDE_DIR})")
    endif()
  endif()
  if(NOT _major MATCHES "MAJOR 3")
    message(WARNING "dcnkit: no oneDNN 3.x headers in ${DCNKIT_ONEDNN3_INCLUDE_DIR} (pip install "
                    "onednn-devel-cpu-gomp): the CPU GEMM will not pack weights")
  endif()
  # A copy of Debian's oneDNN 2.x unpacked by scripts/onednn_fetch.sh into the source tree (the int8 GEMM's).
  set(DCNKIT_ONEDNN_DEPS_DIR "${PROJECT_SOURCE_DIR}/.deps/onednn" CACHE PATH
      "Folder of oneDNN's lib/libdnnl.so.2 and include/ (scripts/onednn_fetch.sh)")
  if(EXISTS "${DCNKIT_ONEDNN_DEPS_DIR}/lib")
    target_compile_definitions(dcnkit_onednn_gemm PRIVATE DCNKIT_ONEDNN_DEPS_DIR="${DCNKIT_ONEDNN_DEPS_DIR}/lib")
  endif()
endfunction()

function(dcnkit_cpu_gemm)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import scipy_openblas32 as s; print(s.get_include_dir()); print(s.get_lib_dir()); print(s.get_library())"
    OUTPUT_VARIABLE _oblas OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _oblas_rc)
  if(NOT _oblas_rc EQUAL 0)
    message(FATAL_ERROR "dcnkit: the ONNX Runtime and OpenVINO libraries need OpenBLAS from the pip package "
                        "scipy-openblas32 (pip install scipy-openblas32) in ${Python_EXECUTABLE}")
  endif()
  string(REPLACE "\n" ";" _oblas "${_oblas}")
  list(GET _oblas 0 _inc)
  list(GET _oblas 1 _libdir)
  list(GET _oblas 2 _name)
  set(DCNKIT_OPENBLAS_INCLUDE_DIR "${_inc}" PARENT_SCOPE)
  set(DCNKIT_OPENBLAS_LIB_DIR "${_libdir}" PARENT_SCOPE)
  set(DCNKIT_OPENBLAS_LIBRARY "${_libdir}/lib${_name}.so" PARENT_SCOPE)
  if(TARGET dcnkit_cpu_gemm)
    return()
  endif()
  message(STATUS "dcnkit: CPU GEMM from OpenBLAS ${_libdir}/lib${_name}.so")
  dcnkit_onednn_gemm()
  set(_src "${PROJECT_SOURCE_DIR}/plugins/core/src/cpu_gemm")
  add_library(dcnkit_cpu_gemm STATIC "${_src}/openblas_gemm.cpp" "${_src}/cpu_gemm.cpp")
  target_include_directories(dcnkit_cpu_gemm SYSTEM PUBLIC "${_inc}")
  target_compile_options(dcnkit_cpu_gemm PRIVATE -Wall -Wextra -O3)
  target_link_libraries(dcnkit_cpu_gemm PUBLIC dcnkit_onednn_gemm "${_libdir}/lib${_name}.so")
endfunction()
