# thetad_daemon_core: the torch-free building blocks of the worker (task schedule, .npy
# reading, metrics, timeline). Included from daemon/CMakeLists.txt; kept free of LibTorch so
# that its unit tests and fuzz targets build in seconds and with any compiler.
add_library(thetad_daemon_core STATIC
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/npy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cpp
  ${CMAKE_CURRENT_LIST_DIR}/timeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/core/job_options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/core/progress.cpp
  ${CMAKE_CURRENT_LIST_DIR}/core/stop_agreement.cpp)
target_include_directories(thetad_daemon_core PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(thetad_daemon_core
  PUBLIC thetad_config thetad_comm thetad_offload thetad_errors thetad_log
  PRIVATE thetad_warnings)
