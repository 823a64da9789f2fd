# NCCL for the ring (src/distributed/): optional. Looked for under NCCL_ROOT or
# NVIDIA_NCCL_ROOT (a cache variable or the environment: an NCCL install, or the
# nvidia-nccl wheel's nvidia/nccl folder), then in the CUDA toolkit, which ships it.
# Sets FA3_NCCL_FOUND and, when found, the imported target fa3_nccl.
set(FA3_NCCL_FOUND FALSE)
if(NOT FA3_WITH_NCCL)
  return()
endif()
set(_fa3_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${NVIDIA_NCCL_ROOT} $ENV{NVIDIA_NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT}
    ${CUDAToolkit_TARGET_DIR})
find_path(FA3_NCCL_INCLUDE_DIR nccl.h HINTS ${_fa3_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
# The toolkit keeps libnccl in lib/ on some installs, lib64/ on others; the wheel has only libnccl.so.2.
find_library(FA3_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_fa3_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib lib64)
if(FA3_NCCL_INCLUDE_DIR AND FA3_NCCL_LIBRARY)
  set(FA3_NCCL_FOUND TRUE)
  add_library(fa3_nccl INTERFACE)
  target_include_directories(fa3_nccl INTERFACE ${FA3_NCCL_INCLUDE_DIR})
  target_link_libraries(fa3_nccl INTERFACE ${FA3_NCCL_LIBRARY})
  message(STATUS "fa3: NCCL ${FA3_NCCL_LIBRARY}, headers ${FA3_NCCL_INCLUDE_DIR}: building fa3_distributed")
else()
  message(STATUS "fa3: NCCL not found (set NCCL_ROOT): fa3_distributed is not built")
endif()
