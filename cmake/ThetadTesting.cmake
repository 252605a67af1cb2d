# Test helpers: GoogleTest binaries, the same binaries run as real MPI processes, and scripts.
#
#   thetad_add_gtest(NAME SOURCES f.cpp... [LIBS l...] [LABELS l...] [TIMEOUT s] [COST c])
#   thetad_add_mpi_test(NAME TARGET exe NP n [ARGS a...] [MPIRUN_ARGS m...] [LABELS l...] [TIMEOUT s] [COST c])
#   thetad_add_script_test(NAME COMMAND cmd... LABELS l... [TIMEOUT s] [PROCESSORS n] [COST c]
#                          [RESOURCE_LOCK r...] [ENVIRONMENT e...])
#
# Every test gets labels (a gtest `unit`, an MPI test `mpi`, a script those it names: the fast
# tier is `ctest -L unit`), the tests' environment, and exit 77 read as "skipped"
# (THETAD_TEST_SKIP_CODE): a GPU test on a machine without one, a tool that is missing (the MPI
# gtest mains exit 77 when every test skipped; scripts: `skip` in tests/lib/test_lib.sh).
# tests/lib/check_tests.py (the test `test_conventions`) holds every registered test to this.
#
# Multi-rank tests run under `mpirun` with the flags of tests/lib/mpirun.flags (loopback,
# oversubscribed) so that they work on a two-core CI machine and inside containers as root.
# PROCESSORS: the cores a test keeps busy (ctest -j N runs tests side by side within N); COST:
# ctest starts the costliest first on a machine without timings of its own (a fresh CI
# machine), so that the longest tests do not start last; afterwards it uses the times it measured.

set(THETAD_TEST_SKIP_CODE 77)

set(_thetad_flags_file ${PROJECT_SOURCE_DIR}/tests/lib/mpirun.flags)
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_thetad_flags_file})
file(STRINGS ${_thetad_flags_file} _thetad_flag_lines REGEX "^[^#]")
list(JOIN _thetad_flag_lines " " THETAD_MPIRUN_FLAGS_TEXT)
separate_arguments(THETAD_MPIRUN_FLAGS UNIX_COMMAND "${THETAD_MPIRUN_FLAGS_TEXT}")
# THETAD_LAUNCH_BIN: the tests' launcher is this build's, wherever the build folder is (the
# source tree's launch/thetad-launch looks in build/ otherwise). THETAD_TEST_MPIRUN_FLAGS: what
# the scripts give mpirun (tests/lib/test_lib.sh: MPIRUN_FLAGS).
set(THETAD_TEST_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
    THETAD_LAUNCH_BIN=${PROJECT_BINARY_DIR}/launch/thetad-launch
    "THETAD_TEST_MPIRUN_FLAGS=${THETAD_MPIRUN_FLAGS_TEXT}")

# The properties every test gets: its labels (a list), timeout (300 s unless given), environment,
# exit 77 as skipped; and those a helper passes on (PROCESSORS, COST, RESOURCE_LOCK, ENVIRONMENT).
function(_thetad_test_properties name labels)
  cmake_parse_arguments(P "" "TIMEOUT;PROCESSORS;COST" "ENVIRONMENT;RESOURCE_LOCK" ${ARGN})
  list(REMOVE_ITEM labels "")
  list(REMOVE_DUPLICATES labels)
  if(NOT labels)
    message(FATAL_ERROR "test ${name}: no LABELS (cmake/ThetadTesting.cmake)")
  endif()
  if(NOT P_TIMEOUT)
    set(P_TIMEOUT 300)
  endif()
  set(env ${THETAD_TEST_ENV} ${P_ENVIRONMENT})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${P_TIMEOUT} LABELS "${labels}" ENVIRONMENT "${env}"
                       SKIP_RETURN_CODE ${THETAD_TEST_SKIP_CODE})
  foreach(property PROCESSORS COST RESOURCE_LOCK)
    if(P_${property})
      set_tests_properties(${name} PROPERTIES ${property} "${P_${property}}")
    endif()
  endforeach()
endfunction()

function(thetad_add_gtest name)
  cmake_parse_arguments(T "" "TIMEOUT;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main thetad_warnings)
  add_test(NAME ${name} COMMAND ${name})
  _thetad_test_properties(${name} "unit;${T_LABELS}" TIMEOUT "${T_TIMEOUT}" COST "${T_COST}")
endfunction()

function(thetad_add_mpi_test name)
  cmake_parse_arguments(T "" "TARGET;NP;TIMEOUT;COST" "ARGS;MPIRUN_ARGS;LABELS" ${ARGN})
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${THETAD_MPIRUN_FLAGS} ${T_MPIRUN_ARGS} -np ${T_NP}
                   $<TARGET_FILE:${T_TARGET}> ${T_ARGS})
  _thetad_test_properties(${name} "mpi;${T_LABELS}" TIMEOUT "${T_TIMEOUT}" PROCESSORS ${T_NP} COST "${T_COST}")
endfunction()

function(thetad_add_script_test name)
  cmake_parse_arguments(T "" "TIMEOUT;PROCESSORS;COST" "COMMAND;LABELS;RESOURCE_LOCK;ENVIRONMENT" ${ARGN})
  add_test(NAME ${name} COMMAND ${T_COMMAND})
  _thetad_test_properties(${name} "${T_LABELS}" TIMEOUT "${T_TIMEOUT}" PROCESSORS "${T_PROCESSORS}"
                          COST "${T_COST}" RESOURCE_LOCK "${T_RESOURCE_LOCK}" ENVIRONMENT "${T_ENVIRONMENT}")
endfunction()
