# cmake -DBUILD_DIR=<fa3 build> -DSOURCE_DIR=<fa3 source> -DWORK_DIR=<scratch> -P run_consumer.cmake
# Installs the fa3 build into a scratch prefix, then configures, builds and runs the
# consumer project against it, as a downstream user would.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
set(gen_args)
if(GENERATOR)
  set(gen_args -G "${GENERATOR}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build" ${gen_args}
                        "-DCMAKE_PREFIX_PATH=${prefix}" "-DFA3_EXAMPLE_SOURCE=${SOURCE_DIR}/examples/forward.cpp"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer project failed (${rc})")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer project failed (${rc})")
endif()
execute_process(COMMAND "${WORK_DIR}/build/forward_example" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "out\\[0\\] = ")
  message(FATAL_ERROR "the example failed (${rc}): ${out}")
endif()
