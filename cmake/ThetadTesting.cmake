# Test helpers: GoogleTest binaries, and the same binaries run as real MPI processes.
#
#   thetad_add_gtest(NAME SOURCES f.cpp... [LIBS l...] [LABELS l...])
#   thetad_add_mpi_test(NAME TARGET exe NP n [ARGS a...] [MPIRUN_ARGS m...] [LABELS l...] [TIMEOUT s])
#
# Multi-rank tests run under `mpirun --oversubscribe` on loopback so that they work on a
# two-core CI machine and inside containers as root. A test that exits THETAD_TEST_SKIP_CODE (77)
# is reported as skipped, not passed: the GPU tests on a machine without one (the MPI gtest mains
# exit 77 when every test skipped; shell tests: `skip` in tests/lib/test_lib.sh).

set(THETAD_TEST_SKIP_CODE 77)

set(THETAD_MPIRUN_FLAGS --oversubscribe --bind-to none
    --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
    --mca pml ob1 --mca osc ^ucx
    CACHE STRING "Flags thetad's multi-rank tests pass to mpirun")
# THETAD_LAUNCH_BIN: the tests' launcher is this build's, wherever the build folder is (the
# source tree's launch/thetad-launch looks in build/ otherwise).
set(THETAD_TEST_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
    THETAD_LAUNCH_BIN=${PROJECT_BINARY_DIR}/launch/thetad-launch)

function(thetad_add_gtest name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main thetad_warnings)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} ENVIRONMENT "${THETAD_TEST_ENV}"
                       SKIP_RETURN_CODE ${THETAD_TEST_SKIP_CODE})
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

function(thetad_add_mpi_test name)
  cmake_parse_arguments(T "" "TARGET;NP;TIMEOUT" "ARGS;MPIRUN_ARGS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${THETAD_MPIRUN_FLAGS} ${T_MPIRUN_ARGS} -np ${T_NP}
                   $<TARGET_FILE:${T_TARGET}> ${T_ARGS})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} ENVIRONMENT "${THETAD_TEST_ENV}"
                       PROCESSORS ${T_NP} LABELS "mpi;${T_LABELS}" SKIP_RETURN_CODE ${THETAD_TEST_SKIP_CODE})
endfunction()
