# Install rules and the CMake package of the worker SDK: after `cmake --install <build> --component sdk
# --prefix P`, a project with CMAKE_PREFIX_PATH=P writes
#     find_package(ddprun REQUIRED)
#     target_link_libraries(app PRIVATE ddprun::sdk)
# ddprun::sdk carries the headers, the static libraries (sdk, the store and the shared helpers,
# and the libtorch layer when built with libtorch) and their dependencies (Boost, spdlog, Threads, Torch, NCCL/CUDA runtime).
# The config is written by hand (imported targets) rather than exported, so the build targets keep their
# source-tree include paths untouched. Included once, after ddprun_sdk (and ddprun_sdk_torch) exist.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ddprun_sdk_install_targets ddprun_sdk ddprun_store ddprun_util)
set(DDPRUN_PACKAGE_WITH_TORCH OFF)
if(TARGET ddprun_sdk_torch)
  list(APPEND ddprun_sdk_install_targets ddprun_sdk_torch)
  set(DDPRUN_PACKAGE_WITH_TORCH ON)
endif()
set(DDPRUN_PACKAGE_WITH_NCCL OFF)
if(DDPRUN_WITH_NCCL_ENABLED AND EXISTS ${CMAKE_CURRENT_LIST_DIR}/../src/nccl_process_group.cc)
  set(DDPRUN_PACKAGE_WITH_NCCL ON)
endif()

install(TARGETS ${ddprun_sdk_install_targets}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT sdk
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT sdk)
install(DIRECTORY ${CMAKE_CURRENT_LIST_DIR}/../include/ddprun
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT sdk FILES_MATCHING PATTERN "*.h")
install(FILES ${DDPRUN_PUBLIC_STORE_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun/rdzv COMPONENT sdk)

set(DDPRUN_INSTALL_LIBDIR ${CMAKE_INSTALL_LIBDIR})
set(DDPRUN_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR})
set(ddprun_config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/ddprun)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ddprunConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ddprunConfig.cmake
                              INSTALL_DESTINATION ${ddprun_config_dir}
                              PATH_VARS DDPRUN_INSTALL_LIBDIR DDPRUN_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddprunConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddprunConfig.cmake ${PROJECT_BINARY_DIR}/ddprunConfigVersion.cmake
        DESTINATION ${ddprun_config_dir} COMPONENT sdk)
