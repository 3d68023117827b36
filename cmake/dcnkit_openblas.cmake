# OpenBLAS from the scipy-openblas32 wheel in the build's Python environment: the CPU GEMM of the runtime adapters
# whose kernels run in the runtime's own thread pool (ONNX Runtime, OpenVINO).
#   dcnkit_openblas()  sets DCNKIT_OPENBLAS_INCLUDE_DIR, DCNKIT_OPENBLAS_LIB_DIR, DCNKIT_OPENBLAS_LIBRARY and makes the
#                      static target dcnkit_openblas (the core's GemmFn over it: plugins/core/src/openblas/) the
#                      first time; FATAL_ERROR when the wheel is missing.

function(dcnkit_openblas)
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
  if(TARGET dcnkit_openblas)
    return()
  endif()
  message(STATUS "dcnkit: CPU GEMM from OpenBLAS ${_libdir}/lib${_name}.so")
  add_library(dcnkit_openblas STATIC "${PROJECT_SOURCE_DIR}/plugins/core/src/openblas/openblas_gemm.cpp")
  target_include_directories(dcnkit_openblas PUBLIC "${PROJECT_SOURCE_DIR}/plugins/core/include")
  target_include_directories(dcnkit_openblas SYSTEM PUBLIC "${_inc}")
  target_compile_features(dcnkit_openblas PUBLIC cxx_std_17)
  target_compile_options(dcnkit_openblas PRIVATE -Wall -Wextra -O3)
  target_link_libraries(dcnkit_openblas PUBLIC "${_libdir}/lib${_name}.so")
endfunction()
