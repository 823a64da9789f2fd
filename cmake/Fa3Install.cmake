# `cmake --install` lays out headers, libraries and a CMake package so that a
# downstream project can write find_package(fa3) and link fa3::fa3.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_fa3_targets fa3_static)
if(TARGET fa3_shared)
  list(APPEND _fa3_targets fa3_shared)
endif()
install(TARGETS ${_fa3_targets} EXPORT fa3Targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/fa3 DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET fa3_cli)
  install(TARGETS fa3_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(_fa3_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/fa3)
install(EXPORT fa3Targets NAMESPACE fa3:: DESTINATION ${_fa3_cmake_dir})
configure_package_config_file(cmake/fa3Config.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/fa3Config.cmake
                              INSTALL_DESTINATION ${_fa3_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/fa3ConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fa3Config.cmake ${CMAKE_CURRENT_BINARY_DIR}/fa3ConfigVersion.cmake
        DESTINATION ${_fa3_cmake_dir})
