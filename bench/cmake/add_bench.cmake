# Adds the bench_engine_bw target to a thetad build whose root CMakeLists does not (yet) add
# bench/ itself (bench/gpu/run.sh passes it; harmless when the root does add bench/):
#   cmake -S . -B build -DCMAKE_PROJECT_INCLUDE=$PWD/bench/cmake/add_bench.cmake
# CMake includes this file right after project(); the work is deferred to the end of the root
# CMakeLists (where every library exists and we know whether bench/ was added). Subdirectories
# cannot be added there, so the target is defined directly. bench_cpu_adam comes from
# tests/offload when tests are built.
if(NOT COMMAND thetad_bench_add_deferred)
  function(thetad_bench_add_deferred)
    if(NOT TARGET bench_engine_bw AND TARGET thetad_comm)
      include(${CMAKE_SOURCE_DIR}/bench/comm/targets.cmake)
    endif()
  endfunction()
endif()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL thetad_bench_add_deferred)
