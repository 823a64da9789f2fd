# Locates the CUTLASS/CuTe headers (pinned: nvidia-cutlass==4.2.0.0) and defines
# the interface target fa3_cutlass. Order: -DFA3_CUTLASS_INCLUDE, the environment
# variable FA3_CUTLASS_INCLUDE, then the Python wheel's copy.
set(FA3_CUTLASS_INCLUDE "$ENV{FA3_CUTLASS_INCLUDE}" CACHE PATH
    "Directory holding cute/ and cutlass/ (CUTLASS 4.2.0 headers)")

if(NOT FA3_CUTLASS_INCLUDE)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c
              "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
      OUTPUT_VARIABLE _fa3_wheel_include OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _fa3_rc)
    if(_fa3_rc EQUAL 0 AND EXISTS "${_fa3_wheel_include}/cute/tensor.hpp")
      set(FA3_CUTLASS_INCLUDE "${_fa3_wheel_include}" CACHE PATH "CUTLASS 4.2.0 headers" FORCE)
    endif()
  endif()
endif()

if(NOT FA3_CUTLASS_INCLUDE OR NOT EXISTS "${FA3_CUTLASS_INCLUDE}/cute/tensor.hpp")
  message(FATAL_ERROR
    "fa3 needs the CUTLASS/CuTe 4.2.0 headers and did not find them.\n"
    "Install them with:  python3 -m pip install --no-deps nvidia-cutlass==4.2.0.0\n"
    "or pass the include directory:  cmake -DFA3_CUTLASS_INCLUDE=/path/to/cutlass/include ...")
endif()

file(STRINGS "${FA3_CUTLASS_INCLUDE}/cutlass/version.h" _fa3_cutlass_ver REGEX "#define CUTLASS_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*CUTLASS_MAJOR ([0-9]+).*CUTLASS_MINOR ([0-9]+).*CUTLASS_PATCH ([0-9]+).*" "\\1.\\2.\\3"
       FA3_CUTLASS_VERSION "${_fa3_cutlass_ver}")
message(STATUS "fa3: CUTLASS ${FA3_CUTLASS_VERSION} headers at ${FA3_CUTLASS_INCLUDE}")
if(NOT FA3_CUTLASS_VERSION VERSION_EQUAL "4.2.0")
  message(WARNING "fa3 is pinned to CUTLASS 4.2.0; found ${FA3_CUTLASS_VERSION}")
endif()

add_library(fa3_cutlass INTERFACE)
target_include_directories(fa3_cutlass SYSTEM INTERFACE "${FA3_CUTLASS_INCLUDE}")
