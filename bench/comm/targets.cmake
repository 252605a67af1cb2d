# The bench_engine_bw and bench_comm_bw targets; included by bench/comm/CMakeLists.txt.
# Its NCCL/CUDA part compiles when thetad_comm carries THETAD_WITH_CUDA (a public definition);
# without it the program only says that it was built without CUDA.
if(NOT TARGET bench_engine_bw)
  add_executable(bench_engine_bw ${CMAKE_CURRENT_LIST_DIR}/bench_engine_bw.cpp)
  target_link_libraries(bench_engine_bw PRIVATE thetad_comm thetad_warnings)
  set_target_properties(bench_engine_bw PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench/comm)
endif()
if(NOT TARGET bench_comm_bw)
  add_executable(bench_comm_bw ${CMAKE_CURRENT_LIST_DIR}/bench_comm_bw.cpp)
  target_link_libraries(bench_comm_bw PRIVATE thetad_comm thetad_warnings)
  set_target_properties(bench_comm_bw PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench/comm)
endif()
