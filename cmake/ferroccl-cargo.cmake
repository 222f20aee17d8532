# cmake -P script run by the ferroccl_cargo target (CMakeLists.txt): builds the library with
# cargo, records the native static libraries, stages lib/ and include/ like `make`.
# Inputs (-D): CARGO SOURCE_DIR TARGET_DIR STAGE_DIR FEATURES CARGO_FLAGS MPICC WITH_MPI
#              WITH_TLS TLS_BACKEND VERSION
cmake_minimum_required(VERSION 3.18)

if(NOT EXISTS "${SOURCE_DIR}/include/nccl.h")
  message(FATAL_ERROR "include/nccl.h is missing: run 'make header'")
endif()

set(ENV{CARGO_TARGET_DIR} "${TARGET_DIR}")
if(NOT MPICC STREQUAL "")
  set(ENV{MPICC} "${MPICC}")
endif()
set(_cmd "${CARGO}" rustc --release --lib --manifest-path "${SOURCE_DIR}/Cargo.toml")
if(NOT FEATURES STREQUAL "")
  list(APPEND _cmd --features "${FEATURES}")
endif()
list(APPEND _cmd ${CARGO_FLAGS} -- --print native-static-libs)

# cargo writes progress and the note on stderr: show it and keep a copy.
execute_process(COMMAND ${_cmd}
  WORKING_DIRECTORY "${SOURCE_DIR}"
  RESULT_VARIABLE _rc
  ERROR_VARIABLE _log
  ECHO_ERROR_VARIABLE)
file(WRITE "${STAGE_DIR}/cargo-build.log" "${_log}")
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "cargo failed (exit ${_rc}); see above")
endif()

string(REGEX MATCHALL "note: native-static-libs: [^\n]*" _notes "${_log}")
list(LENGTH _notes _n)
if(_n EQUAL 0)
  message(FATAL_ERROR "cargo printed no native-static-libs note")
endif()
math(EXPR _last "${_n} - 1")
list(GET _notes ${_last} _note)
string(REGEX REPLACE "^note: native-static-libs: *" "" _libs "${_note}")
string(STRIP "${_libs}" _libs)

function(write_if_changed path content)
  if(EXISTS "${path}")
    file(READ "${path}" _old)
    if(_old STREQUAL content)
      return()
    endif()
  endif()
  file(WRITE "${path}" "${content}")
endfunction()

file(MAKE_DIRECTORY "${STAGE_DIR}/lib" "${STAGE_DIR}/include")
write_if_changed("${STAGE_DIR}/native-static-libs.txt" "${_libs}\n")

set(_out "${TARGET_DIR}/release")
foreach(_pair "libferroccl.so;lib/libferroccl.so" "libferroccl.a;lib/libferroccl.a")
  list(GET _pair 0 _src)
  list(GET _pair 1 _dst)
  execute_process(COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${_out}/${_src}" "${STAGE_DIR}/${_dst}"
                  RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "cannot stage ${_out}/${_src}")
  endif()
endforeach()
execute_process(COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${SOURCE_DIR}/include/nccl.h"
                "${STAGE_DIR}/include/nccl.h")
foreach(_link "libferroccl.so;libnccl.so.2" "libnccl.so.2;libnccl.so" "libferroccl.a;libnccl.a")
  list(GET _link 0 _target)
  list(GET _link 1 _name)
  file(REMOVE "${STAGE_DIR}/lib/${_name}")
  file(CREATE_LINK "${_target}" "${STAGE_DIR}/lib/${_name}" SYMBOLIC)
endforeach()

if(WITH_TLS)
  set(_tls 1)
else()
  set(_tls 0)
endif()
if(WITH_MPI)
  set(_mpi 1)
else()
  set(_mpi 0)
endif()
if(FEATURES MATCHES "(^|,)ib(,|$)")
  set(_ib 1)
else()
  set(_ib 0)
endif()
write_if_changed("${STAGE_DIR}/ferroccl-build.env"
"FERROCCL_VERSION='${VERSION}'
FERROCCL_TLS_BACKEND='${TLS_BACKEND}'
FERROCCL_WITH_TLS=${_tls}
FERROCCL_WITH_MPI=${_mpi}
FERROCCL_WITH_IB=${_ib}
FERROCCL_FEATURES='${FEATURES}'
FERROCCL_NATIVE_STATIC_LIBS='${_libs}'
FERROCCL_BUILT_BY=cmake
")
message(STATUS "staged ${STAGE_DIR}/lib and ${STAGE_DIR}/include (features: ${FEATURES})")
